"""The order the suite's files are handed to its workers in: the longest first.

tests/run.sh runs the suite with `--dist loadfile`: pytest-xdist gives each worker a whole file
at a time, in the order of a queue. Left to itself, xdist orders that queue by the number of tests
in a file, most first, which puts the box's end-to-end files (one to five tests each, a minute or
more each) at its end: one started last while the other worker had nothing left to take,
and that worker could sit idle for minutes. tests/conftest.py turns that off under
`--dist loadfile` (as `--no-loadscope-reorder` does) and sets the collection order, which the
queue then follows, from `order_files` here: the files by their measured seconds
(tests/file_seconds.txt), longest first, so that what starts last is short.

A file missing from the table (new since it was measured) is placed as an end-to-end file is
assumed to take (a long one: better started early than last) when under tests/e2e/, as a short
one elsewhere. `python3 -m tests.suite_order JUNIT_XML` rewrites the table from a run's
`--junitxml` report (each file's setup, call and teardown seconds summed).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "file_seconds.txt"
# seconds assumed for a file the table lacks: an end-to-end file (a box run) or any other
UNKNOWN_E2E_S = 120.0
UNKNOWN_OTHER_S = 1.0


def read_table(path: Path = TABLE) -> dict[str, float]:
    """The table's seconds by file path ("tests/e2e/test_x.py"); {} when it is missing. Lines
    are `SECONDS PATH`; `#` starts a comment. Pure read."""
    if not path.is_file():
        return {}
    table: dict[str, float] = {}
    for line in path.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) == 2:
            table[fields[1]] = float(fields[0])
    return table


def seconds_of(path: str, table: dict[str, float]) -> float:
    """The seconds `path` is expected to take: the table's, else the assumption for a new file."""
    if path in table:
        return table[path]
    return UNKNOWN_E2E_S if path.startswith("tests/e2e/") else UNKNOWN_OTHER_S


def order_files(paths: Iterable[str], table: dict[str, float]) -> list[str]:
    """`paths` (each once), longest expected first; equal ones keep their given order. Pure."""
    given = list(dict.fromkeys(paths))
    return sorted(given, key=lambda p: -seconds_of(p, table))


def file_seconds(junit_xml: Path) -> dict[str, float]:
    """Each test file's seconds in a pytest `--junitxml` report: the sum of its test cases'
    times (setup, call and teardown each). Pure read."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        # the class name is the module's dotted path, then a test class if any: keep up to test_*
        for i, part in enumerate(parts):
            if part.startswith("test_"):
                totals["/".join(parts[: i + 1]) + ".py"] += float(case.get("time", "0"))
                break
    return dict(totals)


def main(argv: list[str]) -> int:
    """`python3 -m tests.suite_order JUNIT_XML`: rewrite tests/file_seconds.txt from a report."""
    if len(argv) != 2 or not Path(argv[1]).is_file():
        print("usage: python3 -m tests.suite_order JUNIT_XML (a pytest --junitxml report)")
        return 2
    totals = file_seconds(Path(argv[1]))
    lines = [
        "# seconds per test file in one run of the suite (tests/run.sh, 2 workers), longest first;",
        "# tests/suite_order.py orders the files by it. Rewrite: python3 -m tests.suite_order XML",
    ]
    lines += [f"{s:.1f} {p}" for p, s in sorted(totals.items(), key=lambda kv: -kv[1])]
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"{len(totals)} files written to {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
