"""A node's side of a bundle, for tests: unpack a real bundle as the bootstrap does.

The commands are read from the bootstrap template itself (jobs/startup.sh.j2, step 4: verify the
sha256, unpack into `bundle/`) and run verbatim with bash, so a test's node folder is laid out
exactly as a node's is. Importable on the nodes' Pythons (3.10+): the agent tests use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from cloudtrain.run.bundle import Bundle

FIRST, LAST = "sha256sum -c", "tar -xzf bundle.tar.gz"


def node_unpack_script() -> str:
    """The bootstrap's lines from the sha256 check through the unpack, verbatim. Pure."""
    text = resources.files("cloudtrain.jobs").joinpath("startup.sh.j2").read_text()
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if FIRST in line]
    ends = [i for i, line in enumerate(lines) if LAST in line]
    assert len(starts) == 1 and len(ends) == 1 and starts[0] < ends[0], (
        "the bootstrap no longer verifies and unpacks the bundle in one place: update this"
    )
    return "\n".join(lines[starts[0] : ends[0] + 1])


def unpack_like_the_node(bundle: Bundle, work: Path) -> Path:
    """Put `bundle` at `work/bundle.tar.gz` and run the bootstrap's verify-and-unpack lines in
    `work`; returns `work/bundle`. Raises CalledProcessError when the node would fail."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundle.path, work / "bundle.tar.gz")
    script = 'set -eu\nfail() { echo "$*" >&2; exit 1; }\n' + node_unpack_script()
    env = {**os.environ, "CT_BUNDLE_SHA256": bundle.sha256}
    subprocess.run(
        ["bash", "-c", script], cwd=work, env=env, check=True, capture_output=True, timeout=120
    )
    return work / "bundle"
