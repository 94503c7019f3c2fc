"""ARCHITECTURE.md stays true to the layout: it names every layer folder in its table of folders,
every node-side module (jobs/*.py) and every contract pyproject.toml declares. A folder, a node
module or a contract added without a word in ARCHITECTURE.md fails here."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[3]
TEXT = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")


def test_the_folder_table_names_every_layer_folder() -> None:
    folders = sorted(
        p.name for p in (ROOT / "cloudtrain").iterdir() if (p / "__init__.py").is_file()
    )
    rows = set(re.findall(r"^\| `cloudtrain/([a-z_]+)/` \|", TEXT, re.MULTILINE))
    assert folders and [f for f in folders if f not in rows] == []


def test_every_node_side_module_is_named() -> None:
    modules = sorted(p.stem for p in (ROOT / "jobs").glob("*.py") if p.stem != "__init__")
    assert modules and [m for m in modules if not re.search(rf"\b{m}\b", TEXT)] == []


def test_every_contract_is_described() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    ids = [c["id"] for c in config["contracts"]]
    assert ids and [i for i in ids if f"- **{i}**:" not in TEXT] == []


def test_the_environment_table_is_the_declarations() -> None:
    from cloudtrain.core.env import table_markdown

    assert table_markdown().strip() in TEXT
