"""The code bundle (cloudtrain/run/bundle.py): determinism, layout, exclusions, symlinks, the wheel.

The bundle is content-addressed, so these tests pin what makes its sha256 change (the bytes of the
workdir) and what must not (mtimes, build folder). The wheel inside it is checked as a wheel: a
valid zip whose RECORD matches, that ships the node side (agent, startup template), and that pip
can install and Python can import without the editable install of this checkout.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import cloudtrain
from cloudtrain.core.errors import SpecError
from cloudtrain.run.bundle import KEEP_WHEELS, Bundle, build_bundle, build_wheel

WHEEL_NAME = f"cloudtrain-{cloudtrain.__version__}-py3-none-any.whl"
DIST_INFO = f"cloudtrain-{cloudtrain.__version__}.dist-info"


@pytest.fixture(scope="module")
def wheel() -> tuple[str, bytes]:
    """The wheel, built once for the module (building is deterministic)."""
    return build_wheel()


def make_workdir(root: Path) -> Path:
    """A small job folder with a nested file, an executable and some noise to exclude."""
    wd = root / "job"
    (wd / "pkg").mkdir(parents=True)
    (wd / "train.py").write_text("print('training')\n")
    (wd / "pkg" / "__init__.py").write_text("")
    (wd / "pkg" / "model.py").write_text("UNITS = 8\n")
    run = wd / "run.sh"
    run.write_text("#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    (wd / "__pycache__").mkdir()
    (wd / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0bytecode")
    (wd / "pkg" / "__pycache__").mkdir()
    (wd / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0bytecode")
    (wd / "stray.pyc").write_bytes(b"\0bytecode")
    (wd / ".git").mkdir()
    (wd / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return wd


def members(bundle: Bundle) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(bundle.path, "r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def read_member(bundle: Bundle, name: str) -> bytes:
    with tarfile.open(bundle.path, "r:gz") as tar:
        fh = tar.extractfile(name)
        assert fh is not None, name
        return fh.read()


def test_same_workdir_gives_same_sha_even_after_touching_mtimes(tmp_path: Path) -> None:
    wd = make_workdir(tmp_path)
    first = build_bundle(wd, tmp_path / "out1")
    later = time.time() + 12345
    for dirpath, _dirs, files in os.walk(wd):
        for name in files:
            os.utime(Path(dirpath) / name, (later, later))
    os.utime(wd, (later, later))
    second = build_bundle(wd, tmp_path / "out2")
    assert second.sha256 == first.sha256
    assert second.path.read_bytes() == first.path.read_bytes()
    assert first.path.name == f"{first.sha256}.tar.gz"
    assert hashlib.sha256(first.path.read_bytes()).hexdigest() == first.sha256
    assert first.size == first.path.stat().st_size
    assert first.key == f"bundle/{first.sha256}.tar.gz"
    # building again into the same folder is idempotent
    assert build_bundle(wd, tmp_path / "out1") == first


def test_changing_one_byte_changes_the_sha(tmp_path: Path) -> None:
    wd = make_workdir(tmp_path)
    before = build_bundle(wd, tmp_path / "out")
    (wd / "pkg" / "model.py").write_text("UNITS = 9\n")
    after = build_bundle(wd, tmp_path / "out")
    assert after.sha256 != before.sha256
    assert before.path.exists() and after.path.exists()


def test_archive_layout_and_exclusions(tmp_path: Path) -> None:
    wd = make_workdir(tmp_path)
    bundle = build_bundle(wd, tmp_path / "out")
    names = members(bundle)
    assert set(names) == {
        f"wheel/{WHEEL_NAME}",
        "workdir",
        "workdir/train.py",
        "workdir/run.sh",
        "workdir/pkg/__init__.py",
        "workdir/pkg/model.py",
    }
    assert [n for n in names if n.startswith("wheel/")] == [f"wheel/{WHEEL_NAME}"]
    assert bundle.wheel_name == WHEEL_NAME
    assert bundle.version == cloudtrain.__version__
    assert bundle.files == 4
    assert names["workdir"].isdir() and names["workdir"].mode == 0o755
    assert names["workdir/run.sh"].mode == 0o755
    assert names["workdir/train.py"].mode == 0o644
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in names.values())
    assert read_member(bundle, "workdir/train.py") == b"print('training')\n"
    assert not any("__pycache__" in n or ".git" in n or n.endswith(".pyc") for n in names)


def test_the_bundled_wheel_is_the_wheel(tmp_path: Path, wheel: tuple[str, bytes]) -> None:
    bundle = build_bundle(make_workdir(tmp_path), tmp_path / "out")
    assert read_member(bundle, f"wheel/{WHEEL_NAME}") == wheel[1]


def test_wheel_is_valid_and_its_record_matches(wheel: tuple[str, bytes]) -> None:
    name, data = wheel
    assert name == WHEEL_NAME
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        names = set(zf.namelist())
        for meta in ("METADATA", "WHEEL", "RECORD"):
            assert f"{DIST_INFO}/{meta}" in names
        metadata = zf.read(f"{DIST_INFO}/METADATA").decode()
        assert "Name: cloudtrain\n" in metadata
        assert f"Version: {cloudtrain.__version__}\n" in metadata
        wheel_file = zf.read(f"{DIST_INFO}/WHEEL").decode()
        assert "Root-Is-Purelib: true" in wheel_file
        assert "Tag: py3-none-any" in wheel_file
        rows = list(csv.reader(io.StringIO(zf.read(f"{DIST_INFO}/RECORD").decode())))
        recorded = {row[0] for row in rows}
        assert recorded == names
        for path, digest, size in rows:
            if path == f"{DIST_INFO}/RECORD":
                assert digest == "" and size == ""
                continue
            content = zf.read(path)
            algo, _, b64 = digest.partition("=")
            assert algo == "sha256", path
            want = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
            assert b64 == want.decode(), path
            assert int(size) == len(content), path


def test_wheel_ships_the_controller_and_the_node_side(wheel: tuple[str, bytes]) -> None:
    with zipfile.ZipFile(io.BytesIO(wheel[1])) as zf:
        names = set(zf.namelist())
    for required in (
        "cloudtrain/__init__.py",
        "cloudtrain/providers/__init__.py",
        "cloudtrain/providers/base.py",
        "cloudtrain/providers/local.py",
        "cloudtrain/jobs/__init__.py",
        "cloudtrain/jobs/agent.py",
        "cloudtrain/jobs/startup.sh.j2",
    ):
        assert required in names, required
    assert not any("__pycache__" in n or n.endswith((".pyc", ".pyo")) for n in names)
    assert not any(n.startswith(("providers/", "jobs/", "tests/")) for n in names)


def test_wheel_is_deterministic(wheel: tuple[str, bytes]) -> None:
    assert build_wheel() == wheel


def test_cached_wheel_is_the_built_wheel(wheel: tuple[str, bytes], tmp_path: Path) -> None:
    assert build_wheel(tmp_path) == wheel  # built, then kept under its inputs' digest
    (kept,) = tmp_path.iterdir()
    assert kept.suffix == ".whl" and kept.read_bytes() == wheel[1]
    assert build_wheel(tmp_path) == wheel  # read back: still the one file
    assert list(tmp_path.iterdir()) == [kept]
    old = [tmp_path / f"{i:064x}.whl" for i in range(KEEP_WHEELS)]  # older wheels: pruned
    for i, path in enumerate(old):
        path.write_bytes(b"old")
        os.utime(path, (i, i))
    kept.unlink()
    assert build_wheel(tmp_path) == wheel
    assert sorted(tmp_path.iterdir()) == sorted([kept, *old[1:]])


def test_symlink_leaving_the_workdir_is_refused(tmp_path: Path) -> None:
    wd = make_workdir(tmp_path)
    (wd / "pkg" / "secrets").symlink_to("/etc/passwd")
    with pytest.raises(SpecError) as info:
        build_bundle(wd, tmp_path / "out")
    assert "pkg/secrets" in str(info.value)
    assert not list(tmp_path.glob("out/*.tar.gz")), "nothing is written for a refused workdir"


def test_symlink_to_a_file_inside_the_workdir_is_packed(tmp_path: Path) -> None:
    wd = make_workdir(tmp_path)
    (wd / "alias.py").symlink_to(wd / "train.py")
    (wd / "pkg" / "rel.py").symlink_to("../train.py")
    bundle = build_bundle(wd, tmp_path / "out")
    assert read_member(bundle, "workdir/alias.py") == b"print('training')\n"
    assert read_member(bundle, "workdir/pkg/rel.py") == b"print('training')\n"
    assert members(bundle)["workdir/alias.py"].isfile()


def test_missing_workdir_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        build_bundle(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "file.py").write_text("")
    with pytest.raises(SpecError):
        build_bundle(tmp_path / "file.py", tmp_path / "out")


def test_wheel_installs_and_imports_without_the_checkout(
    tmp_path: Path, wheel: tuple[str, bytes]
) -> None:
    whl = tmp_path / wheel[0]
    whl.write_bytes(wheel[1])
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            "--no-compile",
            "--target",
            str(target),
            str(whl),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert (target / "cloudtrain" / "jobs" / "startup.sh.j2").is_file()
    code = (
        "import cloudtrain, cloudtrain.jobs.agent, cloudtrain.providers.local\n"
        "from importlib import resources\n"
        "print(cloudtrain.__file__)\n"
        "print(cloudtrain.jobs.agent.__file__)\n"
        "print(len(resources.files('cloudtrain.jobs').joinpath('startup.sh.j2').read_text()))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(target)
    # -S: no site-packages, so neither the editable finder of this checkout nor an installed copy
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    ).stdout.splitlines()
    assert Path(out[0]).is_relative_to(target)
    assert Path(out[1]).is_relative_to(target)
    assert int(out[2]) > 0
