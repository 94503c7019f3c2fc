"""`cloudtrain --help` stays light (issue 31): click's plain help, not typer's rich panels, whose
formatting imports rich's markdown and syntax modules (markdown-it, pygments) at help time, 40%
of the command's time. benchmarks/help_time.py measures the time itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_cli import cli, heavy_modules

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
