"""A run's id: how one is made (`new_run_id`) and the one parse of a run id, or a prefix of one,
that comes from outside (`parse_run_ref`, `parse_run_id`). Pure.

A parsed value is typed: `RunRef` (a run id or a unique prefix of one) or `RunId` (an exact run
id, which is also a valid reference). Both are `str`s, made only here (by `new_run_id` and the
parse functions), so code below the edges (the CLI and `cloudtrain.api`) takes the type and
never checks the shape again.
"""

from __future__ import annotations

import re
import secrets

RUN_ID_HEX = 3  # bytes of randomness: six hex digits after the job's name
# a run id is `new_run_id(name)`: the job's name (spec.py's rule: a lowercase letter, then up to
# 29 lowercase letters, digits or '-') and six lowercase hex digits. Commands take a unique
# prefix of one, so a reference is any non-empty prefix of that shape.
RUN_ID_RE = re.compile(r"[a-z][a-z0-9-]{0,29}-[0-9a-f]{6}")
RUN_REF_RE = re.compile(r"[a-z][a-z0-9-]{0,36}")
RUN_REF_MAX = 37
_MINT = object()  # only this module makes a RunRef or RunId


class RunRef(str):
    """A run id or a non-empty prefix of one, shape checked (`parse_run_ref`): safe in a path,
    a query, a cloud filter or an object key. Made only by this module's functions."""

    __slots__ = ()

    def __new__(cls, value: str, mint: object = None) -> RunRef:
        if mint is not _MINT:
            raise TypeError(f"a {cls.__name__} is made by run_ids.parse_run_ref/parse_run_id")
        return super().__new__(cls, value)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        # pickled and copied as what it is: parsed again where it is rebuilt
        return (parse_run_id if isinstance(self, RunId) else parse_run_ref, (str(self),))


class RunId(RunRef):
    """An exact run id (`new_run_id`'s shape), checked (`parse_run_id`). A RunId is also a
    RunRef: the only run its prefix matches is itself."""

    __slots__ = ()


def new_run_id(name: str) -> RunId:
    """A short unique run id usable in every cloud's resource names, for a job `name` that
    passed the spec's name rule (spec/job.py: what makes it a RunId without a second check)."""
    return RunId(f"{name}-{secrets.token_hex(RUN_ID_HEX)}", _MINT)


def parse_run_ref(value: str) -> RunRef:
    """`value` as a RunRef if it has the shape of a run id or of a prefix of one, else
    UsageError naming the problem in one line. Pure; a RunRef given is returned as it is. The
    edges (the CLI, `cloudtrain.api`, a tag or journal read from a cloud) parse here before any
    path, query, cloud filter or object key is built from the value."""
    if isinstance(value, RunRef):
        return value
    _check(value, exact=False)
    return RunRef(value, _MINT)


def parse_run_id(value: str) -> RunId:
    """`value` as a RunId if it has the exact shape of a run id, else UsageError naming the
    problem in one line. Pure; a RunId given is returned as it is."""
    if isinstance(value, RunId):
        return value
    _check(value, exact=True)
    return RunId(value, _MINT)


def read_run_ref(value: str) -> RunRef | None:
    """`parse_run_ref(value)`, or None where it is not shaped like one: for untrusted values
    that are skipped rather than refused (a cloud's tag). Pure."""
    if isinstance(value, RunRef):
        return value
    if not isinstance(value, str) or RUN_REF_RE.fullmatch(value) is None:
        return None
    return RunRef(value, _MINT)


def check_run_ref(value: str, *, exact: bool = False) -> RunRef:
    """`parse_run_id(value)` when `exact`, else `parse_run_ref(value)`: for callers that
    choose at run time."""
    return parse_run_id(value) if exact else parse_run_ref(value)


def _check(value: str, *, exact: bool) -> None:
    from cloudtrain.core.errors import UsageError

    if not isinstance(value, str):
        raise TypeError(f"a run id is a str, not {type(value).__name__}")
    shown = repr(value[:40] + ("..." if len(value) > 40 else ""))
    what = "a run id" if exact else "a run id (or a unique prefix of one)"
    hint = "`cloudtrain ls` lists the runs"
    if not value:
        raise UsageError(f"expected {what}, got an empty string", hint=hint)
    if len(value) > RUN_REF_MAX:
        raise UsageError(f"{shown} is not {what}: longer than {RUN_REF_MAX} characters", hint=hint)
    rule = RUN_ID_RE if exact else RUN_REF_RE
    if rule.fullmatch(value) is None:
        shape = "NAME-xxxxxx" if exact else "NAME-xxxxxx or a prefix of it"
        raise UsageError(
            f"{shown} is not {what}: expected {shape}, where NAME starts with a lowercase letter "
            "and has only lowercase letters, digits and '-'",
            hint=hint,
        )


def is_run_id(value: str) -> bool:
    """Whether `value` has the exact shape of a run id (as `new_run_id` makes). Pure."""
    return isinstance(value, str) and RUN_ID_RE.fullmatch(value) is not None
