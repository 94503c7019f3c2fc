"""Reading a node's bootstrap log (uploaded by jobs/startup.sh.j2 before the agent starts, on
failure, before a reboot, when an install or a wait begins and at the end of a phase that took
>= 1 s): its current phase, the reason it failed, and how long each phase took.

The script writes lines `<UTC time> cloudtrain-bootstrap[<role>-<index>]: <text>`, where text is
`<phase>: <state>` (e.g. `python: installing tensorflow 2.21.0`, also with a leading `phase `),
`FAILED: <reason>`, or `durations driver=12s python=95s ...`; the agent's end is
`phase agent: exited with <rc> in <N>s`. A phase with steps (a bare image's python phase: apt,
venv, fetch, pip) also writes `steps python: apt=12s venv=3s pip=80s`, and the wheelhouse's
publisher `wheelhouse: <outcome>`; neither changes the phase or the durations. Other lines are
what the commands and the agent printed (a crashed agent's traceback among them). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PHASES = ("driver", "python", "bundle", "agent")
_LINE_RE = re.compile(r"cloudtrain-bootstrap\[[^\]]*\]: (?P<text>.*)$")
_PHASE_RE = re.compile(r"^(?:phase )?(?P<phase>[a-z]+): (?P<state>.+)$")
_DURATION_RE = re.compile(r"(?P<phase>[a-z]+)=(?P<seconds>\d+(?:\.\d+)?)s")
_AGENT_EXIT_RE = re.compile(r"^exited with (?P<rc>-?\d+)\b")
_STEPS_RE = re.compile(r"^steps (?P<phase>[a-z]+): (?P<steps>.*)$")
_WHEELHOUSE_RE = re.compile(r"^(?:phase python: )?(?P<text>wheelhouse(?::)? .+)$")
TAIL_LINES = 20


@dataclass
class BootInfo:
    """What a bootstrap log says so far."""

    phase: str = ""  # e.g. "python: installing tensorflow 2.21.0"
    failed: str | None = None  # the FAILED reason, if the bootstrap failed
    durations: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    agent_exit: int | None = None  # the agent's exit code, once it has exited
    tail: list[str] = field(default_factory=list)  # the last other lines before the end
    # steps inside phases: "python" -> {"apt": 12.0, "venv": 3.0, "pip": 80.0}
    steps: dict[str, dict[str, float]] = field(default_factory=dict)
    wheelhouse: str = ""  # the latest wheelhouse line: fetched, fell back (why), published

    def step_durations(self) -> dict[str, float]:
        """Every step's seconds, each named `<phase>.<step>` (e.g. "python.pip"), in order."""
        return {f"{p}.{n}": secs for p, steps in self.steps.items() for n, secs in steps.items()}


def parse(text: str) -> BootInfo:
    """The latest phase, the failure reason and the phase durations of a bootstrap log. Pure."""
    info = BootInfo()
    others: list[str] = []  # output lines, up to the FAILED line or the agent's exit
    ended = False
    for raw in text.splitlines():
        m = _LINE_RE.search(raw)
        if not m:
            if not ended and raw.strip():
                others.append(raw.rstrip())
            continue
        body = m["text"].strip()
        if body.startswith("FAILED:"):
            info.failed = body.split("FAILED:", 1)[1].strip()
            ended = True
        elif body.startswith("durations "):
            info.durations = {d["phase"]: float(d["seconds"]) for d in _DURATION_RE.finditer(body)}
        elif s := _STEPS_RE.match(body):
            found = _DURATION_RE.finditer(s["steps"])
            info.steps[s["phase"]] = {d["phase"]: float(d["seconds"]) for d in found}
        else:
            if w := _WHEELHOUSE_RE.match(body):
                info.wheelhouse = w["text"]
            p = _PHASE_RE.match(body)
            if p and p["phase"] in PHASES:
                info.phase = f"{p['phase']}: {p['state']}"
                exited = _AGENT_EXIT_RE.match(p["state"]) if p["phase"] == "agent" else None
                if exited:
                    info.agent_exit = int(exited["rc"])
                    ended = True
    info.tail = others[-TAIL_LINES:]
    return info


def durations_text(
    durations: dict[str, float], steps: dict[str, dict[str, float]] | None = None
) -> str:
    """'driver 12s, python 95s (apt 12s, venv 3s, pip 80s), ...' in phase order ('' if none);
    a phase's steps, when given, in brackets after it. Pure."""
    order = [p for p in PHASES if p in durations] + sorted(set(durations) - set(PHASES))
    parts = []
    for p in order:
        inner = ", ".join(f"{n} {secs:.0f}s" for n, secs in (steps or {}).get(p, {}).items())
        parts.append(f"{p} {durations[p]:.0f}s" + (f" ({inner})" if inner else ""))
    return ", ".join(parts)
