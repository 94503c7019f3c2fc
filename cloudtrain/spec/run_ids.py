"""A run's id: how one is made (`new_run_id`) and the one check of a run id or a prefix of one
that comes from outside (`check_run_ref`). Pure.
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


def new_run_id(name: str) -> str:
    """A short unique run id usable in every cloud's resource names (see `check_run_ref`)."""
    return f"{name}-{secrets.token_hex(RUN_ID_HEX)}"


def check_run_ref(value: str, *, exact: bool = False) -> str:
    """`value` if it has the shape of a run id (`exact`) or of a prefix of one, else UsageError
    naming the problem. Pure. Every command checks a run id from the command line here before
    any path, query, cloud filter or object key is built from it; so do the providers' path
    builders (defence in depth)."""
    from cloudtrain.core.errors import UsageError

    shown = repr(value[:40] + ("..." if len(value) > 40 else ""))
    what = "a run id" if exact else "a run id (or a unique prefix of one)"
    hint = "`cloudtrain ls` lists the runs"
    if not value:
        raise UsageError(f"expected {what}, got an empty string", hint=hint)
    if len(value) > RUN_REF_MAX:
        raise UsageError(
            f"{shown} is not {what}: longer than {RUN_REF_MAX} characters", hint=hint
        )
    rule = RUN_ID_RE if exact else RUN_REF_RE
    if rule.fullmatch(value) is None:
        shape = "NAME-xxxxxx" if exact else "NAME-xxxxxx or a prefix of it"
        raise UsageError(
            f"{shown} is not {what}: expected {shape}, where NAME starts with a lowercase letter "
            "and has only lowercase letters, digits and '-'",
            hint=hint,
        )
    return value


def is_run_id(value: str) -> bool:
    """Whether `value` has the exact shape of a run id (as `new_run_id` makes). Pure."""
    return isinstance(value, str) and RUN_ID_RE.fullmatch(value) is not None
