"""Hostile workdirs for the bundler (cloudtrain/run/bundle.py): what a node must never get.

Each refusal is one SpecError line naming the workdir's field and the offending file, raised
before anything is written (the bundles folder does not even exist afterwards), and never a hang:
every build runs under `finishes`, which fails the test when a build does not return. What the
bundler accepts is unpacked with the bootstrap's own commands (tests/unit/bundle_node.py) and
must give the layout the agent expects: a folder `bundle/workdir` and one wheel.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import textwrap
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import cloudtrain.run.bundle
from cloudtrain.core.errors import SpecError
from cloudtrain.core.paths import HOME_ENV, cloudtrain_home
from cloudtrain.jobspec.job import load_spec
from cloudtrain.run.bundle import (
    CHUNK,
    MAX_BUNDLE_BYTES,
    WHEEL_CACHE,
    Bundle,
    build_bundle,
    build_spec_bundle,
    workdir_field,
)
from tests.unit.bundle_node import unpack_like_the_node

T = TypeVar("T")
HANG_S = 60.0  # a build that has not returned by then is hanging


def finishes(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a thread: its result or its exception; fails on a hang."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)} hangs"
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


def refused(workdir: Path, out: Path, match: str, **kwargs: Any) -> SpecError:
    """The build is refused with one SpecError line matching `match`, and writes nothing."""
    before = sorted(out.rglob("*")) if out.exists() else None
    with pytest.raises(SpecError, match=match) as info:
        finishes(build_bundle, workdir, out, **kwargs)
    assert "\n" not in str(info.value)
    after = sorted(out.rglob("*")) if out.exists() else None
    assert after == before, "a refused workdir must leave nothing behind"
    return info.value


def job(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A workdir holding `files` (relative name -> text)."""
    wd = tmp_path / "job"
    wd.mkdir()
    for name, text in (files or {}).items():
        (wd / name).parent.mkdir(parents=True, exist_ok=True)
        (wd / name).write_text(text)
    return wd


def names(bundle: Bundle) -> set[str]:
    with tarfile.open(bundle.path, "r:gz") as tar:
        return set(tar.getnames())


# --- a bundle with nothing in it, and the layout of every bundle that is built ---------------
def _only_the_spec(wd: Path) -> list[Path]:
    (wd / "job.yaml").write_text("name: x\nentrypoint: python -c 'print(1)'\n")
    return [wd / "job.yaml"]


EXCLUDED = (
    ".git/HEAD",
    "__pycache__/m.cpython-311.pyc",
    ".venv/bin/python",
    "node_modules/x/index.js",
    ".cloudtrain/ledger.db",
    "stray.pyc",
    "pkg/o.pyo",
)


def _only_excluded_names(wd: Path) -> list[Path]:
    for name in EXCLUDED:
        (wd / name).parent.mkdir(parents=True, exist_ok=True)
        (wd / name).write_text("x")
    return []


def _only_empty_folders(wd: Path) -> list[Path]:
    (wd / "data" / "raw").mkdir(parents=True)
    (wd / "out").mkdir()
    return []


EMPTY_SHAPES: dict[str, Callable[[Path], list[Path]]] = {
    "empty": lambda wd: [],
    "only-the-spec": _only_the_spec,
    "only-excluded-names": _only_excluded_names,
    "only-empty-folders": _only_empty_folders,
}


@pytest.mark.parametrize("shape", sorted(EMPTY_SHAPES))
def test_a_workdir_with_nothing_to_ship_is_refused(tmp_path: Path, shape: str) -> None:
    wd = job(tmp_path)
    leave_out = EMPTY_SHAPES[shape](wd)
    error = refused(wd, tmp_path / "out", r"^workdir: .* has nothing to ship", leave_out=leave_out)
    assert str(wd.resolve()) in str(error)
    assert error.hint and "workdir" in error.hint


ACCEPTED_SHAPES: dict[str, dict[str, str]] = {
    "one-file": {"train.py": "print(1)\n"},
    "one-file-deep-down": {"a/b/c/d/train.py": "print(1)\n"},
    "odd-names": {"dåta files/ä b.py": "x = 1\n", "-dash.py": "", " lead.py": ""},
    "a-file-next-to-the-spec": {"job.yaml": "name: x\n", "train.py": "print(1)\n"},
}


@pytest.mark.parametrize("shape", sorted(ACCEPTED_SHAPES))
def test_every_accepted_workdir_unpacks_on_the_node_to_the_agents_layout(
    tmp_path: Path, shape: str
) -> None:
    files = ACCEPTED_SHAPES[shape]
    wd = job(tmp_path, files)
    spec = [wd / "job.yaml"] if "job.yaml" in files else []
    bundle = finishes(build_bundle, wd, tmp_path / "out", spec)
    unpacked = unpack_like_the_node(bundle, tmp_path / "node")
    assert (unpacked / "workdir").is_dir()  # the agent's cwd (jobs/agent.py: Agent.workdir)
    assert [p.name for p in (unpacked / "wheel").iterdir()] == [bundle.wheel_name]
    shipped = {
        p.relative_to(unpacked / "workdir").as_posix(): p.read_text()
        for p in (unpacked / "workdir").rglob("*")
        if p.is_file()
    }
    assert shipped == {k: v for k, v in files.items() if k != "job.yaml"}
    assert bundle.files == len(shipped)


@pytest.mark.parametrize("set_in_the_file", [True, False])
def test_the_spec_names_its_file_line_and_the_workdir_field(
    tmp_path: Path, set_in_the_file: bool
) -> None:
    wd = job(tmp_path)
    spec_file = wd / "job.yaml"
    workdir = "workdir: .\n" if set_in_the_file else ""
    spec_file.write_text(f"name: x\nentrypoint: python -c 'print(1)'\n{workdir}")
    spec = load_spec(spec_file)
    out = tmp_path / "out"
    with pytest.raises(SpecError) as info:
        finishes(build_spec_bundle, spec, out)
    at = f"{spec_file}:3" if set_in_the_file else f"{spec_file}"
    assert str(info.value).startswith(f"{at}: workdir: {wd} has nothing to ship"), info.value
    assert workdir_field(spec) == f"{at}: workdir"
    assert not out.exists()


# --- symlinks: loops, dangling links, folders -----------------------------------------------
def _self_loop(wd: Path) -> None:
    (wd / "me").symlink_to("me")


def _pair_loop(wd: Path) -> None:
    (wd / "a").symlink_to("b")
    (wd / "b").symlink_to("a")


def _deep_ring(wd: Path) -> None:
    (wd / "x" / "y").mkdir(parents=True)
    (wd / "x" / "y" / "one").symlink_to("../two")
    (wd / "x" / "two").symlink_to("y/three")
    (wd / "x" / "y" / "three").symlink_to("one")


def _through_a_looping_folder(wd: Path) -> None:
    (wd / "loop").symlink_to("loop")
    (wd / "data.csv").symlink_to("loop/data.csv")


def _folder_to_its_ancestor(wd: Path) -> None:
    (wd / "pkg" / "sub").mkdir(parents=True)
    (wd / "pkg" / "sub" / "up").symlink_to("../..")


def _folder_to_itself_by_path(wd: Path) -> None:
    (wd / "pkg").mkdir()
    (wd / "pkg" / "here").symlink_to(wd / "pkg")


LINKS: dict[str, tuple[Callable[[Path], None], str]] = {
    "self-loop": (_self_loop, r"workdir: me is a symlink loop \(me -> me -> \.\.\.\)"),
    "pair-loop": (_pair_loop, r"workdir: a is a symlink loop \(a -> b -> \.\.\.\)"),
    "three-link-ring": (_deep_ring, r"workdir: x/two is a symlink loop"),
    "through-a-looping-folder": (
        _through_a_looping_folder,
        r"workdir: data\.csv is a symlink loop",
    ),
    "folder-to-its-ancestor": (_folder_to_its_ancestor, r"workdir: pkg/sub/up links to a folder"),
    "folder-to-itself": (_folder_to_itself_by_path, r"workdir: pkg/here links to a folder"),
    "dangling-inside": (
        lambda wd: (wd / "data.csv").symlink_to("gone.csv"),
        r"workdir: data\.csv is not a regular file: a symlink to gone\.csv, which is gone",
    ),
    "dangling-outside": (
        lambda wd: (wd / "data.csv").symlink_to("/no/such/place.csv"),
        r"workdir: data\.csv is not a regular file: a symlink to /no/such/place\.csv",
    ),
    "fifo": (lambda wd: os.mkfifo(wd / "pipe"), r"workdir: pipe is not a regular file"),
    "link-to-a-fifo": (
        lambda wd: (os.mkfifo(wd / "pipe.real"), (wd / "pipe").symlink_to("pipe.real")),
        r"workdir: pipe(\.real)? is not a regular file",
    ),
}


@pytest.mark.parametrize("case", sorted(LINKS))
def test_links_that_loop_dangle_or_name_folders_are_refused_without_a_hang(
    tmp_path: Path, case: str
) -> None:
    make, match = LINKS[case]
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    make(wd)
    refused(wd, tmp_path / "out", "^" + match)


EVIL = "evil\n\x1b[31mred\x1b[0m"  # a newline and a terminal colour


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda wd: os.mkfifo(wd / EVIL), r"is not a regular file"),
        (lambda wd: (wd / "data.csv").symlink_to(EVIL), r"data\.csv is not a regular file"),
        (lambda wd: (wd / EVIL).symlink_to(EVIL), r"is a symlink loop"),
    ],
    ids=["fifo-named", "dangling-link-to", "loop-named"],
)
def test_a_hostile_name_can_neither_split_nor_colour_the_error_line(
    tmp_path: Path, make: Callable[[Path], None], match: str
) -> None:
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    make(wd)
    text = str(refused(wd, tmp_path / "out", match))  # one line: refused() checks it
    assert "\x1b" not in text
    assert repr(EVIL) in text


def test_links_in_excluded_folders_are_never_looked_at(tmp_path: Path) -> None:
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    (wd / ".git").mkdir()
    (wd / ".git" / "loop").symlink_to("loop")
    (wd / ".git" / "etc").symlink_to("/etc")
    (wd / "node_modules").symlink_to("/usr/lib")
    (wd / "old.pyc").symlink_to("old.pyc")
    bundle = finishes(build_bundle, wd, tmp_path / "out")
    assert names(bundle) == {f"wheel/{bundle.wheel_name}", "workdir", "workdir/train.py"}


def test_a_link_to_the_left_out_spec_is_left_out_too(tmp_path: Path) -> None:
    wd = job(tmp_path, {"train.py": "print(1)\n", "job.yaml": "secret: yes\n"})
    (wd / "config.yaml").symlink_to("job.yaml")
    bundle = finishes(build_bundle, wd, tmp_path / "out", [wd / "job.yaml"])
    assert names(bundle) == {f"wheel/{bundle.wheel_name}", "workdir", "workdir/train.py"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any folder, whatever its mode")
def test_an_unreadable_folder_is_an_error_not_a_skip(tmp_path: Path) -> None:
    wd = job(tmp_path, {"train.py": "print(1)\n", "pkg/model.py": "x = 1\n"})
    (wd / "pkg").chmod(0)
    try:
        refused(wd, tmp_path / "out", r"^workdir: cannot read the folder pkg: Permission denied")
    finally:
        (wd / "pkg").chmod(0o755)


# --- size: streaming, and the ceiling -------------------------------------------------------
def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)  # no blocks on disk: reads return zeros
    return path


def _packed_peak(wd: Path, out: Path) -> tuple[Bundle, int]:
    """Build, and the most memory Python held at once while it did."""
    tracemalloc.start()
    try:
        bundle = build_bundle(wd, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return bundle, peak


def _streamed_sha(path: Path) -> str:
    want = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            want.update(block)
    return want.hexdigest()


def test_a_big_file_is_read_and_packed_by_streaming(tmp_path: Path) -> None:
    size = 256 * 2**20
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    _sparse(wd / "weights.bin", size)
    bundle, peak = _packed_peak(wd, tmp_path / "out")
    # reading the file whole would hold all of its 256 MiB at once
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB while packing a 256 MiB file"
    assert _streamed_sha(bundle.path) == bundle.sha256 == bundle.path.name.split(".")[0]
    with tarfile.open(bundle.path, "r:gz") as tar:
        member = tar.getmember("workdir/weights.bin")
        assert member.size == size
        fh = tar.extractfile(member)
        assert fh is not None
        zeros, seen = bytes(CHUNK), 0
        for block in iter(lambda: fh.read(CHUNK), b""):
            assert block == zeros[: len(block)]
            seen += len(block)
        assert seen == size


def test_a_big_archive_is_hashed_by_streaming(tmp_path: Path) -> None:
    size = 48 * 2**20  # random bytes do not compress: the archive is as big
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    with open(wd / "noise.bin", "wb") as fh:
        for _ in range(size // CHUNK):
            fh.write(os.urandom(CHUNK))
    bundle, peak = _packed_peak(wd, tmp_path / "out")
    assert bundle.size > size
    # hashing (or compressing) the archive whole would hold all of its 48 MiB at once
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB while packing a 48 MiB archive"
    assert _streamed_sha(bundle.path) == bundle.sha256


def test_a_workdir_over_the_ceiling_is_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    _sparse(wd / "a.bin", MAX_BUNDLE_BYTES // 2)
    _sparse(wd / "b.bin", MAX_BUNDLE_BYTES // 2 + 1)
    refused(wd, tmp_path / "out", r"^workdir: .* is larger than 512 MiB \(reached at b\.bin\)")


def test_a_workdir_with_too_many_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cloudtrain.run.bundle, "MAX_BUNDLE_FILES", 3)
    wd = job(tmp_path, {f"f{i}.py": "" for i in range(3)})
    assert finishes(build_bundle, wd, tmp_path / "ok").files == 3
    (wd / "f3.py").write_text("")
    refused(wd, tmp_path / "out", r"^workdir: .* holds more than 3 files")


# --- cloudtrain's own home inside the workdir -----------------------------------------------
def _home_with_state(home: Path) -> None:
    for name in ("ledger.db", "bundles/0ld.tar.gz", "runs/r-1/startup.sh", "local/n/console.log"):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("state")


def test_cloudtrain_home_inside_the_workdir_is_never_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    home = wd / "state"  # not the default name, which is excluded by name anyway
    monkeypatch.setenv(HOME_ENV, str(home))
    _home_with_state(home)
    (wd / "ledger-copy.db").symlink_to("state/ledger.db")
    first = finishes(build_bundle, wd, cloudtrain_home() / "bundles")  # as the orchestrator
    assert names(first) == {f"wheel/{first.wheel_name}", "workdir", "workdir/train.py"}
    assert first.left_out == ("ledger-copy.db", "state")
    # the home changed (a new bundle in it): what is shipped did not
    second = finishes(build_bundle, wd, cloudtrain_home() / "bundles")
    assert second.sha256 == first.sha256


def test_the_bundles_folder_inside_the_workdir_is_never_shipped(tmp_path: Path) -> None:
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    first = finishes(build_bundle, wd, wd / "build")
    second = finishes(build_bundle, wd, wd / "build")
    assert second.sha256 == first.sha256 and second.left_out == ("build",)
    assert names(second) == {f"wheel/{second.wheel_name}", "workdir", "workdir/train.py"}


def test_the_home_itself_is_refused_as_a_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    _home_with_state(home)
    refused(home, tmp_path / "out", r"^workdir: .* is cloudtrain's own home")
    (home / "bundles" / "job").mkdir()
    (home / "bundles" / "job" / "train.py").write_text("print(1)\n")
    refused(home / "bundles" / "job", home / "bundles", r"^workdir: .* own bundles folder")


def test_a_workdir_inside_the_home_is_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    _home_with_state(home)
    wd = home / "jobs" / "j"
    wd.mkdir(parents=True)
    (wd / "train.py").write_text("print(1)\n")
    bundle = finishes(build_bundle, wd, home / "bundles")
    assert names(bundle) == {f"wheel/{bundle.wheel_name}", "workdir", "workdir/train.py"}


# --- two builds at once ---------------------------------------------------------------------
def _racy_workdir(tmp_path: Path) -> Path:
    wd = job(tmp_path, {"train.py": "print(1)\n"})
    (wd / "blob.bin").write_bytes(os.urandom(4 * 2**20))  # slow to write: a wide window
    return wd


def _no_wheel_temps(out: Path) -> list[Path]:
    """What `out` holds besides the wheel cache, whose files must be whole wheels only."""
    cache = out / WHEEL_CACHE
    if cache.exists():
        assert all(p.suffix == ".whl" for p in cache.iterdir()), list(cache.iterdir())
    return [p for p in out.iterdir() if p.name != WHEEL_CACHE]


def _check_one_whole_bundle(out: Path, shas: set[str]) -> None:
    assert len(shas) == 1, shas
    assert sorted(p.name for p in _no_wheel_temps(out)) == [f"{shas.pop()}.tar.gz"]  # no temp
    (bundle,) = _no_wheel_temps(out)
    assert hashlib.sha256(bundle.read_bytes()).hexdigest() == bundle.name.split(".")[0]
    with tarfile.open(bundle, "r:gz") as tar:
        assert "workdir/blob.bin" in tar.getnames()


def test_builds_in_threads_at_once_each_end_with_a_whole_bundle(tmp_path: Path) -> None:
    wd, out = _racy_workdir(tmp_path), tmp_path / "out"
    start = threading.Barrier(4)
    shas: list[str] = []
    errors: list[BaseException] = []

    def builder() -> None:
        start.wait()
        for _ in range(3):
            try:
                shas.append(build_bundle(wd, out).sha256)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=builder, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_S)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(shas) == 12
    _check_one_whole_bundle(out, set(shas))


def test_builds_in_two_processes_at_once_each_end_with_a_whole_bundle(tmp_path: Path) -> None:
    wd, out, go = _racy_workdir(tmp_path), tmp_path / "out", tmp_path / "go"
    code = textwrap.dedent(
        """
        import os, sys, time
        from pathlib import Path
        from cloudtrain.run.bundle import build_bundle
        while not os.path.exists(sys.argv[3]):
            time.sleep(0.001)
        for _ in range(5):
            print(build_bundle(Path(sys.argv[1]), Path(sys.argv[2])).sha256, flush=True)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(wd), str(out), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    go.touch()
    shas: set[str] = set()
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=HANG_S * 2)
        assert proc.returncode == 0, stderr[-2000:]
        assert len(stdout.split()) == 5
        shas.update(stdout.split())
    _check_one_whole_bundle(out, shas)


def test_an_interrupted_build_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = job(tmp_path, {"a.py": "", "b.py": ""})
    out = tmp_path / "out"
    real_addfile = tarfile.TarFile.addfile
    calls: list[str] = []

    def interrupted(self: tarfile.TarFile, info: tarfile.TarInfo, *args: Any) -> None:
        calls.append(info.name)
        if info.name == "workdir/b.py":
            raise KeyboardInterrupt  # Ctrl-C halfway through the files
        real_addfile(self, info, *args)

    monkeypatch.setattr(tarfile.TarFile, "addfile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_bundle(wd, out)
    assert "workdir/a.py" in calls  # the archive was under way
    assert _no_wheel_temps(out) == []
