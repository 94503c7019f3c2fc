"""A local HTTP fake of the three price APIs, serving the recorded responses in
tests/fixtures/pricing/, and the tests of the shared HTTP helper
(`cloudtrain.catalog.pricing.common`).

The fake answers, on one port:
- AWS Price List Query API: POST / with `X-Amz-Target: AWSPriceListService.GetProducts` (JSON 1.1).
  It applies the request's TERM_MATCH filters to the products in aws_products.json and pages them
  three at a time (NextToken), returning PriceList entries as JSON strings like the real API.
- GCP Cloud Billing Catalog API: GET /v1/services/6F81-5844-456A/skus, two recorded pages linked
  by nextPageToken; the API key must be `test-key` (else HTTP 403 in Google's error format).
- Azure Retail Prices API: GET /api/retail/prices, recorded pages per armRegionName of $filter and
  $skip; NextPageLink's https://prices.azure.com:443 is rewritten to the fake's own address.
`faults[api] = (status, body, skip, times)` answers `times` requests of that API, after the first
`skip`, with that status and raw body (HTTP 500, malformed JSON, ...). Every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.catalog.pricing import common
from cloudtrain.core import retry
from cloudtrain.core.errors import CredentialsError, ProviderError, TransientError
from cloudtrain.providers.gcp import pricing as gcp_pricing

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pricing"
GCP_PAGES = {
    "": "gcp_skus_page1.json",
    "CKrZ2QEQAhoQMkM0Ni1CQUJFLTYxRjMtMDE": "gcp_skus_page2.json",
}
AWS_PAGE = 3


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


class FakePriceApis(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, str, Any]] = []  # (api, path with query, body)
        self.faults: dict[str, tuple[int, bytes, int, int]] = {}
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, api: str, path: str, body: Any) -> tuple[int, bytes, str]:
        with self.lock:
            self.requests.append((api, path, body))
            self.counts[api] = self.counts.get(api, 0) + 1
            fault = self.faults.get(api)
            if fault and fault[2] < self.counts[api] <= fault[2] + fault[3]:
                return fault[0], fault[1], "application/json"
        if api == "aws":
            return 200, json.dumps(self._aws(body)).encode(), "application/x-amz-json-1.1"
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        if api == "gcp":
            if query.get("key") != ["test-key"]:
                error = {"error": {"code": 403, "message": "API key not valid.", "status": "X"}}
                return 403, json.dumps(error).encode(), "application/json"
            page = GCP_PAGES.get(query.get("pageToken", [""])[0])
            if page is None:
                return (
                    400,
                    b'{"error": {"code": 400, "message": "bad pageToken"}}',
                    "application/json",
                )
            return 200, (FIXTURES / page).read_bytes(), "application/json"
        region = re.search(r"armRegionName eq '([^']+)'", query.get("$filter", [""])[0])
        skip = int(query.get("$skip", ["0"])[0])
        name = f"azure_{region.group(1) if region else 'none'}_page{skip // 100 + 1}.json"
        data = load(name) if (FIXTURES / name).is_file() else {"Items": [], "NextPageLink": None}
        if data.get("NextPageLink"):
            data["NextPageLink"] = data["NextPageLink"].replace(
                "https://prices.azure.com:443", self.url
            )
        return 200, json.dumps(data).encode(), "application/json"

    @staticmethod
    def _aws(request: dict[str, Any]) -> dict[str, Any]:
        wanted = [(f["Field"], f["Value"]) for f in request.get("Filters", [])]
        docs = [
            d
            for d in load("aws_products.json")
            if all(d["product"]["attributes"].get(k) == v for k, v in wanted)
        ]
        start = int(request.get("NextToken") or 0)
        size = min(AWS_PAGE, int(request.get("MaxResults") or AWS_PAGE))
        out: dict[str, Any] = {
            "FormatVersion": "aws_v1",
            "PriceList": [json.dumps(d) for d in docs[start : start + size]],
        }
        if start + size < len(docs):
            out["NextToken"] = str(start + size)
        return out


class _Handler(BaseHTTPRequestHandler):
    server: FakePriceApis

    def _reply(self, api: str, body: Any) -> None:
        status, data, kind = self.server.answer(api, self.path, body)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/services/6F81-5844-456A/skus"):
            self._reply("gcp", None)
        elif self.path.startswith("/api/retail/prices"):
            self._reply("azure", None)
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("X-Amz-Target") == "AWSPriceListService.GetProducts":
            self._reply("aws", json.loads(raw or b"{}"))
        else:
            self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


def serve_fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakePriceApis]:
    """Run the fake with every endpoint override set, a throwaway CLOUDTRAIN_HOME (tmp_path/home),
    fake AWS credentials and a GCP key, and near-zero retry backoff (body of a fixture)."""
    server = FakePriceApis()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    env = {
        "CLOUDTRAIN_HOME": str(tmp_path / "home"),
        "CLOUDTRAIN_PRICING_GCP_URL": server.url,
        "CLOUDTRAIN_PRICING_AZURE_URL": server.url,
        "CLOUDTRAIN_GCP_PRICING_KEY": "test-key",
        "AWS_ENDPOINT_URL_PRICING": server.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "NO_PROXY": "127.0.0.1,localhost",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_ENDPOINT_URL",
        "CLOUDTRAIN_LOCAL_PRICE_USD",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    monkeypatch.setattr(retry, "BACKOFF_MAX_S", 0.002)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def price_apis(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakePriceApis]:
    yield from serve_fakes(monkeypatch, tmp_path)


def test_get_json_reads_a_page_and_hides_the_key(price_apis: FakePriceApis) -> None:
    url = f"{price_apis.url}/v1/services/6F81-5844-456A/skus?key=test-key"
    page = common.get_json(url, api="GCP")
    assert len(page["skus"]) == 12 and page["nextPageToken"]
    with pytest.raises(CredentialsError) as caught:
        common.get_json(url.replace("test-key", "secret-wrong-key"), api="GCP", auth_hint="set it")
    assert "HTTP 403: API key not valid." in str(caught.value) and "set it" in str(caught.value)
    assert "secret-wrong-key" not in str(caught.value)


def test_get_json_retries_5xx_then_raises_transient(price_apis: FakePriceApis) -> None:
    price_apis.faults["gcp"] = (503, b'{"error": {"message": "backend unavailable"}}', 0, 99)
    with pytest.raises(TransientError, match="HTTP 503: backend unavailable"):
        common.get_json(f"{price_apis.url}/v1/services/6F81-5844-456A/skus", api="GCP")
    assert price_apis.counts["gcp"] == common.HTTP_ATTEMPTS


def test_get_json_recovers_after_one_429(price_apis: FakePriceApis) -> None:
    price_apis.faults["azure"] = (429, b"slow down", 0, 1)
    url = f"{price_apis.url}/api/retail/prices?$filter=armRegionName eq 'westus2'".replace(
        " ", "%20"
    )
    assert len(common.get_json(url, api="Azure")["Items"]) == 4
    assert price_apis.counts["azure"] == 2


def test_get_json_malformed_and_4xx_are_provider_errors(price_apis: FakePriceApis) -> None:
    price_apis.faults["azure"] = (200, b'{"Items": [', 0, 99)
    url = f"{price_apis.url}/api/retail/prices"
    with pytest.raises(ProviderError, match="malformed JSON") as caught:
        common.get_json(url, api="Azure Retail Prices API")
    assert not isinstance(caught.value, TransientError)
    assert price_apis.counts["azure"] == 1  # not retried
    price_apis.faults["azure"] = (400, b'{"Error": {"Message": "Invalid OData filter"}}', 0, 99)
    with pytest.raises(ProviderError, match="HTTP 400: Invalid OData filter"):
        common.get_json(url, api="Azure Retail Prices API")


def test_get_json_connection_refused_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "BACKOFF_INITIAL_S", 0.001)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    server.server_close()  # nothing listens on this port now
    with pytest.raises(TransientError, match=r"cannot reach http://127\.0\.0\.1"):
        common.get_json(f"http://127.0.0.1:{port}/x?key=k", api="GCP", timeout=2)


def test_base_url_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gcp_pricing.GCP_URL_ENV, raising=False)
    assert common.base_url(gcp_pricing.GCP_URL_ENV, "https://x.test") == "https://x.test"
    monkeypatch.setenv(gcp_pricing.GCP_URL_ENV, "http://127.0.0.1:9/ ")
    assert common.base_url(gcp_pricing.GCP_URL_ENV, "https://x.test") == "http://127.0.0.1:9"
