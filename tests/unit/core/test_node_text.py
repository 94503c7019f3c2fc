"""cloudtrain.core.node_text: untrusted text as displayable text, numbers as short finite
figures."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cloudtrain.core.node_text import ELLIPSIS, figure, finite, shown, shown_lines, whole

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


@pytest.mark.parametrize(
    ("raw", "expect"),
    [
        ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
        ("\x9b2J", "\\x9b2J"),
        ("a\rb\bc\x7fd", "a\\rb\\x08c\\x7fd"),
        ("one\ntwo", "one\\ntwo"),
        ("tab\there", "tab    here"),
        ("bad \ud800", "bad \ufffd"),
        (b"\xff\xfe ok \x1b[2J", "\ufffd\ufffd ok \\x1b[2J"),
        ("rtl \u202e x \u2028", "rtl \\u202e x \\u2028"),
        ("[bold]x[/] C:\\path", "[bold]x[/] C:\\path"),  # markup and backslashes stay as text
        (None, ""),
        (42, "42"),
    ],
)
def test_shown_escapes_every_control(raw: object, expect: str) -> None:
    assert shown(raw) == expect


def test_shown_bounds_the_length_with_an_ellipsis() -> None:
    assert shown("x" * 10, 5) == "xxxx" + ELLIPSIS
    assert len(shown("\x1b" * 10_000, 50)) == 50
    assert shown("x" * 10_000, None) == "x" * 10_000
    assert shown("short", 5) == "short"


def test_shown_lines_keeps_line_breaks_and_bounds_them() -> None:
    assert shown_lines("a\x1b\nb\r\n") == "a\\x1b\nb\\r\n"
    many = shown_lines("\n".join(["x"] * 10), max_lines=3)
    assert many.splitlines() == ["x", "x", "x", f"{ELLIPSIS} 7 more line(s)"]


@given(st.text() | st.binary())
def test_nothing_unsafe_survives(raw: str | bytes) -> None:
    out = shown(raw, 40)
    assert UNSAFE.search(out) is None and len(out) <= 40
    assert UNSAFE.search(shown_lines(raw, 40).replace("\n", "")) is None


@pytest.mark.parametrize(
    ("value", "spec", "expect"),
    [
        (float("nan"), ".4f", "-"),
        (float("inf"), ".4f", "-"),
        (None, ".4f", "-"),
        ("1.5", ".4f", "-"),
        (True, ".4f", "-"),
        (10**4000, ".4f", "-"),
        (1e308, ".4f", "1e+308"),
        (-1e15, ",.0f", "-1e+15"),
        (0.25, ".4f", "0.2500"),
        (1234.5, ",.0f", "1,234"),
    ],
)
def test_figure_is_finite_and_short(value: object, spec: str, expect: str) -> None:
    assert figure(value, spec) == expect


def test_finite_and_whole() -> None:
    assert finite(2) == 2.0 and finite(float("nan")) is None and finite(10**400) is None
    assert whole(12) == "12" and whole(10**400) == "?" and whole("3") == "?" and whole(True) == "?"
