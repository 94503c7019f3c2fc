"""Pack the job's workdir and the cloudtrain wheel into one content-addressed tar.gz.

The archive is deterministic (sorted entries, zeroed times and owners, gzip mtime 0): the same
inputs give the same sha256, which names the object in the bucket (`bundle/<sha256>.tar.gz`) and
lets a node verify what it fetched. The wheel is built in-process from the installed package
(a few milliseconds, no `pip wheel`), so nodes run exactly the controller's code.

Layout inside the archive: `workdir/...` and `wheel/cloudtrain-<version>-py3-none-any.whl`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.metadata
import io
import os
import stat
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cloudtrain
from cloudtrain.errors import SpecError

EXCLUDE_DIRS = frozenset({".git", "__pycache__", ".ipynb_checkpoints", ".venv", "node_modules"})
EXCLUDE_SUFFIXES = (".pyc", ".pyo")
MAX_BUNDLE_BYTES = 512 * 1024 * 1024
_WHEEL_SUFFIXES = (".py", ".j2", ".csv")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Bundle:
    """A built bundle: where it is, its sha256 (its name in the bucket) and what it holds."""

    path: Path
    sha256: str
    size: int
    wheel_name: str
    version: str
    files: int

    @property
    def key(self) -> str:
        """The object key under the run's prefix."""
        return f"bundle/{self.sha256}.tar.gz"


def _package_sources() -> list[tuple[str, Path]]:
    """(archive name, file) for every shipped file of the three import packages."""
    import cloudtrain.jobs
    import cloudtrain.providers

    roots = {
        "cloudtrain": Path(cloudtrain.__file__).parent,
        "cloudtrain/providers": Path(cloudtrain.providers.__file__).parent,
        "cloudtrain/jobs": Path(cloudtrain.jobs.__file__).parent,
    }
    out: list[tuple[str, Path]] = []
    for arc_root, root in roots.items():
        for dirpath, dirs, files in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            # in a regular install the roots nest; the set() below drops the repeats
            dirs[:] = sorted(d for d in dirs if d not in EXCLUDE_DIRS and d != "examples")
            for fname in sorted(files):
                if fname.endswith(_WHEEL_SUFFIXES):
                    rel = (rel_dir / fname).as_posix()
                    out.append((f"{arc_root}/{rel}".replace("/./", "/"), Path(dirpath) / fname))
    return sorted(set(out))


def build_wheel() -> tuple[str, bytes]:
    """Build the cloudtrain wheel from the running code. Deterministic; pure apart from reads."""
    version = cloudtrain.__version__
    dist_info = f"cloudtrain-{version}.dist-info"
    try:
        requires = importlib.metadata.requires("cloudtrain") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    metadata = "Metadata-Version: 2.1\nName: cloudtrain\nVersion: {}\n{}".format(
        version, "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    extras = sorted({r.split("extra ==")[1].strip(" '\"") for r in requires if "extra ==" in r})
    metadata += "".join(f"Provides-Extra: {e}\n" for e in extras)
    files: list[tuple[str, bytes]] = [(a, p.read_bytes()) for a, p in _package_sources()]
    files += [
        (f"{dist_info}/METADATA", metadata.encode()),
        (
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: cloudtrain\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n",
        ),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\ncloudtrain = cloudtrain.cli:main\n"),
    ]
    record_lines = []
    for arcname, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{arcname},sha256={digest},{len(data)}")
    record_lines.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record_lines) + "\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"cloudtrain-{version}-py3-none-any.whl", buf.getvalue()


def _workdir_files(workdir: Path) -> list[tuple[str, Path]]:
    """Files of the workdir, sorted. Refuses symlinks that leave the workdir."""
    root = workdir.resolve()
    out: list[tuple[str, Path]] = []
    for dirpath, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDE_DIRS)
        for name in list(dirs) + sorted(files):
            path = Path(dirpath) / name
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(root):
                    rel = path.relative_to(root)
                    raise SpecError(
                        f"workdir: {rel} is a symlink to {target}, outside the workdir {root}",
                        hint="copy the file into the workdir or remove the link",
                    )
                if target.is_dir():
                    raise SpecError(f"workdir: {path.relative_to(root)} links to a folder")
        for fname in sorted(files):
            if fname.endswith(EXCLUDE_SUFFIXES):
                continue
            path = Path(dirpath) / fname
            if not path.is_file():  # a FIFO would block the read; a dangling link has no data
                raise SpecError(
                    f"workdir: {path.relative_to(root)} is not a regular file",
                    hint="remove it from the workdir",
                )
            out.append((path.relative_to(root).as_posix(), path))
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def build_bundle(workdir: Path, out_dir: Path, leave_out: Sequence[Path] = ()) -> Bundle:
    """Pack `workdir` and the wheel into `out_dir/<sha256>.tar.gz`, without the files in
    `leave_out` (the job spec: it may hold inline secrets, and the nodes get cluster.json
    instead). Deterministic; idempotent."""
    if not workdir.is_dir():
        raise SpecError(f"workdir {workdir} does not exist or is not a folder")
    wheel_name, wheel = build_wheel()
    raw = io.BytesIO()
    total = len(wheel)
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, f"wheel/{wheel_name}", wheel)
        skip = {p.resolve() for p in leave_out}
        files = [(rel, path) for rel, path in _workdir_files(workdir) if path.resolve() not in skip]
        for rel, path in files:
            data = path.read_bytes()
            total += len(data)
            if total > MAX_BUNDLE_BYTES:
                raise SpecError(
                    f"workdir {workdir} is larger than {MAX_BUNDLE_BYTES // 2**20} MiB",
                    hint="keep data sets in a bucket and read them from the job",
                )
            mode = 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644
            _add(tar, f"workdir/{rel}", data, mode)
    packed = gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)
    sha = hashlib.sha256(packed).hexdigest()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{sha}.tar.gz"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(packed)
        os.replace(tmp, path)
    return Bundle(path, sha, len(packed), wheel_name, cloudtrain.__version__, len(files))
