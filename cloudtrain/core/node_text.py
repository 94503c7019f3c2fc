"""Untrusted text and numbers (what a node, its bucket or a cloud wrote) made safe to show.

A node's log lines, its heartbeat's last line and activity, its status reason, its failure
report and the names read from its bucket reach a terminal only through this module. Every
control character that could act on a terminal is shown escaped: the C0 controls (ESC and so
every escape sequence: colours, titles, OSC 52 clipboard writes, OSC 8 links, screen clears,
cursor moves, device queries; \\r, \\b, BEL), DEL, the C1 controls (\\x9b is a one-byte CSI),
the Unicode line separators and the bidirectional overrides. A tab becomes spaces; a lone
surrogate (undecodable bytes) becomes U+FFFD; a backslash stays as it is. Text is never markup
here: callers wrap the result in rich's `Text`, never in a markup string. Numbers are shown
finite and short, `-` where there is none to show. Pure, standard library only.
"""

from __future__ import annotations

import math
import re

ELLIPSIS = "…"
LINE_LIMIT = 500  # characters of one shown line of node text, by default
NO_FIGURE = "-"  # a figure that is missing, not a number, NaN or infinite

# every character that a terminal would act on rather than print, or that reorders or breaks
# lines: C0 but the tab, DEL, C1, U+2028/2029, the bidi embeddings/overrides/isolates, and the
# lone surrogates of undecodable bytes
_UNSAFE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\t]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "    "}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown(value: object, limit: int | None = LINE_LIMIT) -> str:
    """`value` as one line of plain text: every control character escaped (a newline too, as
    `\\n`), at most `limit` characters (the cut marked with an ellipsis; None: no bound).
    Bytes are read as UTF-8 with U+FFFD for what is not; None is ""; anything else not a str
    is its str(). Idempotent on its own output's safety (the output has nothing left to
    escape). Pure."""
    text = _text(value)
    if limit is not None and len(text) > limit + 16:
        text = text[: limit + 16]  # every char is at least one shown: enough to cut from
    if _UNSAFE.search(text):
        text = _UNSAFE.sub(_escape, text)
    return _bounded(text, limit)


def shown_lines(
    value: object, limit: int | None = LINE_LIMIT, max_lines: int | None = 200
) -> str:
    """`value` as lines of plain text: each line as `shown` gives it (at most `limit`
    characters), at most `max_lines` lines (then a line saying how many more there were; None:
    all). A \\r\\n or a lone \\r inside a line is escaped, not a line break. Pure."""
    lines = _text(value).split("\n")
    extra = 0 if max_lines is None else len(lines) - max_lines
    out = [shown(line, limit) for line in (lines if max_lines is None else lines[:max_lines])]
    if extra > 0:
        out.append(f"{ELLIPSIS} {extra} more line(s)")
    return "\n".join(out)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


def _bounded(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + ELLIPSIS


def finite(value: object) -> float | None:
    """`value` as a finite float, or None: not a number (a bool, a string, None), NaN, an
    infinity, or an int too big for a float. Pure."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def figure(value: object, spec: str = ".4g", width: int = 12) -> str:
    """A number as at most `width` characters: `format(value, spec)` when that fits, else in
    3 significant digits ('1.23e+15'); NO_FIGURE ('-') for no finite number. Never raises
    for any `value`. Pure."""
    number = finite(value)
    if number is None:
        return NO_FIGURE
    try:
        text = format(number, spec)
    except ValueError:  # a spec that does not suit a float
        text = ""
    if not text or len(text) > width:
        text = f"{number:.3g}"
    return _bounded(text, width)


def whole(value: object, width: int = 9) -> str:
    """A whole number (an epoch, an attempt) as text, or '?' for anything else: not an int, or
    wider than `width` digits. Pure."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "?"
    if abs(value) >= 10**width:
        return "?"
    return str(value)


def fmt_duration(seconds: float) -> str:
    """'1h02m', '3m05s' or '12.3s' ('-' for no finite number, '?' beyond 10^6 hours). Pure."""
    if finite(seconds) is None:
        return "-"
    if abs(seconds) >= 3.6e9:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
