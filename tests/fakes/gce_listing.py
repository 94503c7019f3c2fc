"""Paged answers to the GCE fake's list requests.

`page()` turns the stored resources of one collection into GCE's list answer: it applies the
`filter` query parameter (see gce_filters), then pages with `maxResults` (0 or absent meaning
GCE's default and maximum of 500) and `pageToken` (here the index of the page's first item),
setting `nextPageToken` while items remain and leaving `items` out of an empty page, as GCE does.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.fakes.gce_errors import invalid, invalid_field
from tests.fakes.gce_filters import matches_filter, parse_filter

MAX_RESULTS = 500  # GCE's default and maximum page size


def page(
    items: list[dict[str, Any]], query: dict[str, str], self_link: str, kind: str
) -> dict[str, Any]:
    """One page of `items` (already in list order) as GCE answers a list request."""
    if query.get("filter", "").strip():
        terms = parse_filter(query["filter"])
        items = [i for i in items if matches_filter(i, terms)]
    try:
        size = int(query.get("maxResults") or MAX_RESULTS)
        start = int(query.get("pageToken") or "0")
    except ValueError as exc:
        raise invalid(f"Invalid maxResults or pageToken: {exc}") from exc
    if not 0 <= size <= MAX_RESULTS:
        raise invalid_field("maxResults", size, f"Must be in [0, {MAX_RESULTS}].")
    size = size or MAX_RESULTS
    answer: dict[str, Any] = {"kind": kind, "id": self_link, "selfLink": self_link}
    chunk = items[start : start + size]
    if chunk:
        answer["items"] = copy.deepcopy(chunk)
    if start + size < len(items):
        answer["nextPageToken"] = str(start + size)
    return answer
