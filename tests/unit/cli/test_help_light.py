"""`cloudtrain --help` and `plan` stay light (issue 31): click's plain help, not typer's rich
panels, whose formatting imports rich's markdown and syntax modules (markdown-it, pygments) at
help time, 40% of the command's time; `plan` loads none of the live view.
benchmarks/help_time.py and plan_time.py measure the times themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli.test_cli import EXAMPLES, cli, heavy_modules

HELP_FORMATTING = ("typer.rich_utils", "rich.markdown", "rich.syntax", "markdown_it", "pygments")


@pytest.mark.parametrize(
    ("args", "expect"),
    [(("--help",), "Usage: cloudtrain"), (("plan", "--help"), "Usage: cloudtrain plan")],
)
def test_help_imports_no_rich_help_formatting(
    tmp_path: Path, args: tuple[str, ...], expect: str
) -> None:
    assert heavy_modules(tmp_path, *args, expect=expect, of=HELP_FORMATTING) == []


def test_help_lists_every_command_with_its_first_sentence_whole(tmp_path: Path) -> None:
    listed = cli(tmp_path, "--help").stdout
    assert "..." not in listed.split("Commands:")[1], listed
    assert "  check        Ask your cloud accounts, read-only" in listed, listed
    assert listed.index("  schema ") < listed.index("  catalog "), listed


def test_plan_loads_none_of_the_live_view(tmp_path: Path) -> None:
    """`plan` prints a table: the live view's modules (rich.live, the throughput and trace
    readers) are a run's, 8% of `plan`'s time."""
    job = str(EXAMPLES / "digits-multiworker" / "job.yaml")
    live = ("cloudtrain.cli.ui", "rich.live", "cloudtrain.insight.trace_view")
    live += ("cloudtrain.cli.runs",)  # status and logs: main names only their options
    assert heavy_modules(tmp_path, "plan", job, expect="plan for digits", of=live) == []
