"""What a node cannot run: the rules for the strings a spec sends to its nodes. Stdlib only.

The same functions run twice: at spec time (`cloudtrain/jobspec/job.py`, which adds
`file:line: field`) and on the node just before exec (`jobs/agent.py`), so a value that arrives
bad anyway becomes a failed status with a reason instead of an agent error on every attempt.
Each function returns what is wrong in one line, or None; no message ever contains the value
itself (it may be a secret, or hold the very characters that are refused), only positions and
code points.

How the node uses each field (jobs/agent.py): `setup` and `entrypoint` each run as
`bash -c TEXT` (one argv string) in the workdir, with the job's environment: the node's own
environment, then the spec's `env` (from cluster.json), then what cloudtrain sets (TF_CONFIG,
CLOUDTRAIN_*, TF_USE_LEGACY_KERAS, PYTHONUNBUFFERED, and PATH with the node's Python first).

Characters (the C0 controls U+0000-U+001F, DEL U+007F and the C1 controls U+0080-U+009F):
- NUL is refused everywhere: argv and environment strings are NUL-terminated C strings
  (execve(2)); Python refuses them with "embedded null byte".
- Lone surrogates (U+D800-U+DFFF, which a YAML escape like "\\ud800" can make) are refused
  everywhere: they have no UTF-8 encoding, so they cannot reach exec at all.
- `entrypoint` is one command line (the plan and the logs show it as one): TAB is its only
  control, besides the line ends that close it (YAML's `|` and `>` keep one; `bash -c` runs the
  line the same with or without them). A line break inside (LF, CR, VT, FF, NEL U+0085,
  LS U+2028, PS U+2029) would hide a second command from anyone reading that line; ESC and the
  rest are terminal escapes, never shell. Several commands belong in `setup`, or in a script
  in the workdir.
- `setup` is a multi-line shell script: TAB and LF only. CR is refused because bash reads it as
  part of a word (`pip\\r: command not found`: a file with CRLF line ends); the other controls
  as in the entrypoint.
- Both are code, so the Unicode bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E,
  U+200F, U+061C) are refused too: they make the text shown differ from the text run ("Trojan
  Source", CVE-2021-42574; Unicode UAX #9). Plain RTL letters are fine.
- `env` values are data the job reads, never parsed by the node: TAB, LF and CR are allowed
  (multi-line PEM keys, JSON, CRLF text); the other C0 controls, DEL and the C1 controls are
  refused: no text a program reads from its environment holds them (they are terminal escapes
  pasted with coloured output, or line breaks to some tools, NEL to Python's splitlines, and not
  to others). Any other Unicode (combining marks, RTL, zero-width, U+2028) passes untouched.

Sizes (execve(2), "Limits on size of arguments and environment", and the kernel's
fs/exec.c): each argv or `KEY=VALUE` string may be at most MAX_ARG_STRLEN = 32 pages = 131072
bytes with its NUL; all of argv and envp together (strings with their NULs, plus one pointer
each) at most a quarter of the stack limit (RLIMIT_STACK): 2 MiB with the usual 8 MiB, which is
what `sysconf(_SC_ARG_MAX)` reports. exec fails with E2BIG ("Argument list too long") past
either. At spec time the node's stack limit is unknown: the spec's strings may use at most
SPEC_EXEC_BUDGET (half of the 2 MiB), leaving the rest to the node's own environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cloudtrain.core.env import PREFIX
from cloudtrain.jobs.strategies import HOROVOD
from cloudtrain.jobs.strategies import strategy as lookup_strategy

PAGE_SIZE = 4096  # x86-64 and arm64 Linux as the clouds' images run them
MAX_ARG_STRLEN = 32 * PAGE_SIZE  # execve(2): one argv/envp string, its NUL included
DEFAULT_ARG_MAX = 8 * 1024 * 1024 // 4  # execve(2): RLIMIT_STACK / 4, with the usual 8 MiB
SPEC_EXEC_BUDGET = DEFAULT_ARG_MAX // 2  # the spec's share of one exec (the node has the rest)
POINTER_BYTES = 8  # each argv/envp entry also costs its pointer (64-bit)
SHELL_ARGV = ("bash", "-c")  # how the agent runs setup and the entrypoint

_BIDI = frozenset(
    [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
)  # UAX #9's explicit formatting characters and marks
_LINE_BREAKS = frozenset([0x0A, 0x0B, 0x0C, 0x0D, 0x85, 0x2028, 0x2029])
# the controls each kind of text may hold (every other C0, DEL and C1 control is refused)
ALLOWED_CONTROLS = {
    "entrypoint": frozenset("\t"),
    "setup": frozenset("\t\n"),
    "env": frozenset("\t\n\r"),
}
_NAMES = {
    0x00: "a NUL byte",
    0x09: "a tab",
    0x0A: "a line break",
    0x0B: "a vertical tab",
    0x0C: "a form feed",
    0x0D: "a carriage return",
    0x1B: "an escape",
    0x7F: "a delete",
    0x85: "a next-line (NEL)",
    0x2028: "a line separator",
    0x2029: "a paragraph separator",
}

# Keys refused because the node's own tools break, or the job would not get the value it says.
# Found by what the agent and bash do with them (jobs/agent.py child_env, bash(1) INVOCATION).
_KEY_PROBLEMS = {
    "PATH": "cannot be set: the node puts its Python's folder first on PATH so that the job's"
    " bash and python are found; extend it in the entrypoint or setup instead"
    " (export PATH=/opt/tool/bin:$PATH)",
    "PYTHONHOME": "cannot be set: it moves the standard library away from the node's python,"
    " which then cannot start; use PYTHONPATH, or a venv made in setup",
    "PYTHONPLATLIBDIR": "cannot be set: the node's python cannot start with another library"
    " folder; use PYTHONPATH, or a venv made in setup",
    "BASH_ENV": "cannot be set: bash would run that file before setup and the entrypoint;"
    " source it at the start of the entrypoint or setup instead",
    "SHELLOPTS": "cannot be set: the bash that runs setup and the entrypoint would take its"
    " options from it, unseen in their text (an unknown one is an error); use `set -o OPTION`"
    " at the start of the entrypoint or setup instead",
    "BASHOPTS": "cannot be set: the bash that runs setup and the entrypoint would take its"
    " options from it, unseen in their text (an unknown one is an error); use `shopt -s"
    " OPTION` at the start of the entrypoint or setup instead",
    "IFS": "cannot be set: bash ignores an IFS from the environment; set it in the script",
    "TF_CONFIG": "is reserved: cloudtrain sets TF_CONFIG and CLOUDTRAIN_* itself",
    "TF_USE_LEGACY_KERAS": "is reserved: cloudtrain sets it to 1 on every node (tf-keras)",
    "PYTHONUNBUFFERED": "is reserved: cloudtrain sets it on every node (logs stream live)",
}
# what jobs/horovod.py sets for each rank (tests/unit/jobs/test_node_rules.py keeps them in step)
HOROVOD_OWN = HOROVOD.reserved_env


class RefusedInput(RuntimeError):
    """The node will not run a spec's string (the agent reports it as a failed status)."""


def _char_name(cp: int) -> str:
    return f"{_NAMES.get(cp, 'a control character')} (U+{cp:04X})"


def text_problem(kind: str, text: str) -> str | None:
    """What is wrong with `text` as `kind` ('entrypoint', 'setup' or 'env': an env value) for
    the node, or None. Checks the characters (see the module docstring) and the size of one exec
    string. Pure; the message names a position and a code point, never the text."""
    allowed = ALLOWED_CONTROLS[kind]
    code = kind in ("entrypoint", "setup")
    for pos, ch in enumerate(text, 1):
        cp = ord(ch)
        if cp == 0:
            return f"contains a NUL byte at character {pos}: exec cannot pass it (C strings)"
        if 0xD800 <= cp <= 0xDFFF:
            return (
                f"contains a lone surrogate (U+{cp:04X}) at character {pos}: not valid UTF-8,"
                " so no exec can pass it"
            )
        if kind == "entrypoint" and ch == "\n" and not text[pos:].strip("\n"):
            continue  # the final line ends YAML's | and > leave: bash runs the one line the same
        control = cp < 0x20 or 0x7F <= cp <= 0x9F
        if control and ch not in allowed:
            why = _why(kind, cp)
            return f"contains {_char_name(cp)} at character {pos}: {why}"
        if kind == "entrypoint" and cp in _LINE_BREAKS:  # U+2028/2029 (the rest are controls)
            return f"contains {_char_name(cp)} at character {pos}: {_why(kind, cp)}"
        if code and cp in _BIDI:
            return (
                f"contains a bidirectional control (U+{cp:04X}) at character {pos}: it makes"
                " the code shown differ from the code run (Trojan Source); remove it"
            )
    if kind != "env":
        size = len(text.encode("utf-8")) + 1
        if size > MAX_ARG_STRLEN:
            return (
                f"is {size - 1} bytes, over the {MAX_ARG_STRLEN - 1} bytes Linux passes as one"
                " argument (MAX_ARG_STRLEN); put it in a script in the workdir and run that"
            )
    return None


def _why(kind: str, cp: int) -> str:
    if kind == "entrypoint" and cp in _LINE_BREAKS:
        return "the entrypoint is one command line; put more lines in setup or in a script"
    if kind == "setup" and cp == 0x0D:
        return "bash reads a CR as part of a word; save the text with LF line ends"
    if kind == "env":
        return "an env value may hold tabs and line breaks (LF, CR), no other control"
    return "shell code holds no control character but tabs and line breaks; remove it"


def env_key_problem(key: str, strategy: str | None = None) -> str | None:
    """What is wrong with `key` as an environment variable the spec sets on the nodes, or None:
    not a shell name, reserved by cloudtrain, or one that breaks the node's tools or that they
    ignore (see _KEY_PROBLEMS). With a `strategy` whose launcher sets names per process (its
    declaration's `reserved_env`, jobs/strategies.py), those are reserved too. Pure."""
    if not key or not (key[0].isascii() and (key[0].isalpha() or key[0] == "_")):
        return "is not a valid environment variable name (letters, digits and '_')"
    if not all(c.isascii() and (c.isalnum() or c == "_") for c in key):
        return "is not a valid environment variable name (letters, digits and '_')"
    if key.startswith(PREFIX):
        return _KEY_PROBLEMS["TF_CONFIG"]
    if key in _KEY_PROBLEMS:
        return _KEY_PROBLEMS[key]
    info = lookup_strategy(strategy)
    if info is not None and key in info.reserved_env:
        return f"is reserved under strategy {strategy}: the launcher sets it for each process"
    return None


def env_entry_problem(key: str, value: str) -> str | None:
    """What is wrong with the value of `key` (its characters, and `KEY=VALUE` as one exec
    string), or None. Pure; never names the value."""
    problem = text_problem("env", value)
    if problem:
        return problem
    size = len(key.encode()) + 1 + len(value.encode("utf-8")) + 1
    if size > MAX_ARG_STRLEN:
        return (
            f"{key}=VALUE is {size - 1} bytes, over the {MAX_ARG_STRLEN - 1} bytes Linux passes"
            " as one environment string (MAX_ARG_STRLEN); ship it as a file in the workdir"
        )
    return None


def exec_size(argv: list[str], env: Mapping[str, str]) -> int:
    """The bytes one exec of `argv` with `env` takes of ARG_MAX: every string with its NUL plus
    one pointer each (fs/exec.c). Pure."""
    strings = [*argv, *(f"{k}={v}" for k, v in env.items())]
    return sum(len(s.encode("utf-8", "surrogateescape")) + 1 + POINTER_BYTES for s in strings)


def spec_exec_problem(setup: str, entrypoint: str, env: Mapping[str, str]) -> str | None:
    """What is wrong with the total size of the spec's part of an exec (the longer of setup and
    the entrypoint, as `bash -c TEXT`, plus every env entry), or None: at most
    SPEC_EXEC_BUDGET bytes, half of the usual ARG_MAX. Pure."""
    longest = max(setup, entrypoint, key=lambda t: len(t.encode("utf-8", "surrogateescape")))
    size = exec_size([*SHELL_ARGV, longest], env)
    if size > SPEC_EXEC_BUDGET:
        return (
            f"the entrypoint or setup and the env values together take {size} bytes of one"
            f" exec, over the {SPEC_EXEC_BUDGET} a spec may use (Linux's ARG_MAX is 2 MiB with"
            " the usual stack; the node needs the rest); ship large values as files in the workdir"
        )
    return None


def arg_max() -> int:
    """This machine's ARG_MAX (sysconf: RLIMIT_STACK / 4), or DEFAULT_ARG_MAX if unknown."""
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        return DEFAULT_ARG_MAX
    return value if value > 0 else DEFAULT_ARG_MAX


def launch_problem(
    kind: str,
    command: str,
    env: Mapping[str, str],
    spec_env: Mapping[str, str],
    strategy: str | None = None,
) -> str | None:
    """On the node, before `bash -c command` with `env` (the whole environment, of which
    `spec_env` is the spec's part): what would make the exec fail or not do what the spec says,
    as `FIELD: problem`, or None. `kind` is 'entrypoint' or 'setup'. Pure but for sysconf."""
    problem = text_problem(kind, command)
    if problem:
        return f"{kind}: {problem}"
    for key, value in spec_env.items():
        problem = env_key_problem(str(key), strategy)
        if problem is None and isinstance(value, str):
            problem = env_entry_problem(str(key), value)
        elif problem is None:
            problem = f"must be a string (got {type(value).__name__})"
        if problem:
            return f"env.{key}: {problem}"
    size, limit = exec_size([*SHELL_ARGV, command], env), arg_max()
    if size > limit:
        return (
            f"{kind}: with the environment, one exec takes {size} bytes, over this node's"
            f" ARG_MAX of {limit} (execve(2): a quarter of the stack limit)"
        )
    return None
