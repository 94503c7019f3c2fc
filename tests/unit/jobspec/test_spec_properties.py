"""The spec's contract, by property (hypothesis): any value written into job.yaml either loads as
exactly what the file says (and then the node accepts it too), or is refused with ONE line
`job.yaml:LINE: ...`. Values: control bytes, huge sizes, odd Unicode, YAML's edge forms, plain
and quoted. The same generators drive the e2e runs (tests/e2e/test_spec_property_runs.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloudtrain.core.errors import SpecError
from cloudtrain.jobs.node_rules import env_entry_problem, text_problem
from cloudtrain.jobspec.job import JobSpec, load_spec_text

ERROR_LINE = re.compile(r"^job\.yaml:\d+: \S")
# YAML 1.2 core schema (what the spec reads), written out independently of
# cloudtrain.jobspec.yaml_source
FLOAT_12 = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
INT_12 = re.compile(r"[-+]?(0|[1-9][0-9]*)")
EDGE_FORMS = [
    "1:30", "010", "0x1f", "0o17", "0b11", "yes", "no", "on", "off", "y", "N", "~", "null",
    "Null", ".nan", ".NaN", ".inf", "-.inf", "2026-01-01", "2026-01-01T10:00:00Z", "1_000",
    "1e3", "1E-2", ".5", "5.", "+7", "-0", "0", "00", "true", "False", "TRUE", "=", "<<",
    "12:30:45", "0.0", "168", "168.0001", "1e400", "9" * 30,
]
ODD = [
    "\x00", "\t", "\n", "\r", "\x0b", "\x0c", "\x1b", "\x7f", "\x80", "\x85", "\x9f", "\u00a0",
    "\u0301", "\u200b", "\u200d", "\u200e", "\u202e", "\u2066", "\u2028", "\u2029", "\ufeff",
    "\ud800", "\udfff", "\U0001f600", "\u05d0", "\u0627", "'", '"', "\\", "$", "`", "#", ":",
    " ", "%", "*", "&", "!", "|", ">", "{", "}", "[", "]", ",", "-",
]

texts = st.one_of(
    st.text(st.sampled_from(ODD) | st.characters(), max_size=40),
    st.sampled_from(EDGE_FORMS),
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\U0001f600"]),
              st.sampled_from([1, 1000, 40_000, 131_070, 131_071, 131_072, 300_000])),
)


def quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar, escaping what a file cannot hold raw. Pure."""
    out = []
    for ch in text:
        cp = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif cp < 0x20 or 0x7F <= cp <= 0x9F or 0xD800 <= cp <= 0xDFFF or cp in (
            0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF,
        ):
            out.append(f"\\u{cp:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def is_plain(value: str) -> bool:
    """Whether YAML reads `V: value` as one plain scalar whose text is `value` (else the
    generated text is other YAML syntax: quotes, a flow mapping, a comment...)."""
    try:
        root = yaml.compose("V: " + value + "\n", Loader=yaml.BaseLoader)
    except yaml.YAMLError:
        return False
    node = root.value[0][1] if isinstance(root, yaml.MappingNode) and root.value else None
    return isinstance(node, yaml.ScalarNode) and node.style is None and node.value == value


def load(text: str, tmp_path: Path) -> JobSpec | str:
    """The spec, or the error line (asserting the error's shape: one line with file:line)."""
    try:
        return load_spec_text(text, filename="job.yaml", base_dir=tmp_path)
    except SpecError as exc:
        message = str(exc)
        assert "\n" not in message and ERROR_LINE.match(message), message
        return message


HEAD = "name: job\n"
SETTINGS = settings(
    max_examples=300, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(value=texts)
def test_a_quoted_string_loads_exactly_or_is_refused(value: str, tmp_path: Path) -> None:
    """entrypoint, setup and an env value, double-quoted: the value the spec holds is the very
    string written, and the node accepts whatever the spec does."""
    for field in ("entrypoint", "setup", "env"):
        if field == "env":
            text = HEAD + "entrypoint: python train.py\nenv:\n  V: " + quoted(value) + "\n"
        elif field == "setup":
            text = HEAD + "entrypoint: python train.py\nsetup: " + quoted(value) + "\n"
        else:
            text = HEAD + "entrypoint: " + quoted(value) + "\n"
        if len(text.encode("utf-8", "surrogatepass")) > 1024 * 1024:
            continue
        got = load(text, tmp_path)
        if isinstance(got, str):
            kind = "env" if field == "env" else field
            problem = env_entry_problem("V", value) if kind == "env" else text_problem(kind, value)
            empty = field == "entrypoint" and not value.strip()
            assert problem or empty, f"{field}={value[:60]!r} refused: {got}"
            continue
        held = got.env_values()["V"] if field == "env" else getattr(got, field)
        assert held == value
        problem = env_entry_problem("V", held) if field == "env" else text_problem(field, held)
        assert problem is None


@SETTINGS
@given(value=texts)
def test_a_plain_value_is_what_yaml_1_2_says_or_refused(value: str, tmp_path: Path) -> None:
    """Plain (unquoted) in a number, a bool and an env value: what YAML 1.2's core schema says
    the text is, or one error line. Never YAML 1.1's reading (`1:30` = 90, `yes` = true)."""
    if len(value) > 200 or not is_plain(value):
        return
    for field in ("max_hours", "spot", "env"):
        if field == "spot":
            text = HEAD + "entrypoint: x\ncluster:\n  spot: " + value + "\n"
        elif field == "env":
            text = HEAD + "entrypoint: x\nenv:\n  V: " + value + "\n"
        else:
            text = HEAD + "entrypoint: x\nmax_hours: " + value + "\n"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            continue  # a lone surrogate cannot be in a file at all
        got = load(text, tmp_path)
        if isinstance(got, str):
            continue
        if field == "max_hours":
            assert FLOAT_12.fullmatch(value) and not re.fullmatch(r"[-+]?0[0-9]+", value), value
            assert got.max_hours == float(value) and 0 < got.max_hours <= 168
            assert not math.isnan(got.max_hours)
        elif field == "spot":
            assert value in ("true", "True", "TRUE", "false", "False", "FALSE"), value
            assert got.cluster.spot is (value.lower() == "true")
        else:  # text, exactly as written: never a number, bool or null form
            assert got.env_values()["V"] == value
            assert not (INT_12.fullmatch(value) or FLOAT_12.fullmatch(value)), value
            assert value not in ("true", "false", "null", "~", "TRUE", "Null", ".nan", ".inf")
