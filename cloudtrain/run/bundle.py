"""Pack the job's workdir and the cloudtrain wheel into one content-addressed tar.gz.

The archive is deterministic (sorted entries, zeroed times and owners, gzip mtime 0): the same
inputs give the same sha256, which names the object in the bucket (`bundle/<sha256>.tar.gz`) and
lets a node verify what it fetched. The wheel is built in-process from the installed package
(no `pip wheel`), so nodes run exactly the controller's code; deflating it is most of the
build's time, so the bundles folder keeps each wheel under a digest of what it is made from
(`wheels/`, see build_wheel) and the next run of the same code reads it back.

Layout inside the archive: `wheel/cloudtrain-<version>-py3-none-any.whl`, the folder `workdir`
and `workdir/...`. The node unpacks it into `<work>/bundle` (jobs/startup.sh.j2) and the agent
runs the entrypoint in `<work>/bundle/workdir` (jobs/agent.py), so a bundle always holds that
folder and at least one file in it: a workdir with nothing to ship is refused.

The rules for what a workdir may hold (each refusal is one SpecError naming the file, raised
before anything is written):
- Left out, by name: EXCLUDE_DIRS folders and EXCLUDE_SUFFIXES files, never looked into.
- Left out, by place: cloudtrain's own home (`$CLOUDTRAIN_HOME`: the ledger, old bundles,
  rendered scripts, local runs) and the bundles folder when they are inside the workdir, the
  spec file (`leave_out`), and symlinks into any of these. `Bundle.left_out` names the folders.
- Symlinks to a file inside the workdir are packed as that file. Symlinks that leave the
  workdir, point to a folder, point to nothing or loop (`a -> b -> a`, `a -> a`) are refused;
  folder links are never followed, so no loop can make the walk go round.
- Anything but a regular file (FIFO, socket, device) is refused: reading it could block.
- At most MAX_BUNDLE_FILES files and MAX_BUNDLE_BYTES bytes, checked from the sizes while
  walking, before a byte is read or written.

Files are hashed and packed by streaming (1 MiB at a time) into a temporary file unique to the
process and call, which an atomic rename turns into `<sha256>.tar.gz`: builds racing on one
folder (two `run`s of one job) each end with a whole bundle.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import hashlib
import importlib.metadata
import io
import os
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import cloudtrain
from cloudtrain.core.errors import SpecError, UsageError
from cloudtrain.core.paths import HOME_ENV, cloudtrain_home
from cloudtrain.jobspec.yaml_source import printable

if TYPE_CHECKING:
    from cloudtrain.jobspec.job import JobSpec

# `.cloudtrain`: the default name of cloudtrain's home (cloudtrain/core/paths.py), wherever it is
EXCLUDE_DIRS = frozenset(
    {".git", "__pycache__", ".ipynb_checkpoints", ".venv", "node_modules", ".cloudtrain"}
)
EXCLUDE_SUFFIXES = (".pyc", ".pyo")
# The bundle carries code, not data: every node downloads and unpacks it at boot, so 512 MiB
# (of workdir files, before compression) is a policy ceiling, far below what the stores take
# through our uploads, which are multipart or resumable: S3 takes 5 GB in a single PUT and
# 10,000 parts of up to 5 GB in a multipart upload (docs.aws.amazon.com/AmazonS3/latest/
# userguide/qfacts.html), a GCS object may be 5 TiB (cloud.google.com/storage/quotas), an
# Azure block blob 50,000 blocks (learn.microsoft.com/rest/api/storageservices/put-block-list).
MAX_BUNDLE_BYTES = 512 * 1024 * 1024
MAX_BUNDLE_FILES = 100_000  # a policy too: more files than any code base has; data goes in a bucket
CHUNK = 1024 * 1024  # what one read or write holds in memory
_WHEEL_SUFFIXES = (".py", ".j2", ".csv")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
WHEEL_CACHE = "wheels"  # the built wheels, in the bundles folder (build_wheel's cache_dir)
KEEP_WHEELS = 8  # how many of them are kept
_DATA_HINT = "keep data sets in a bucket and read them from the job"


@dataclass(frozen=True)
class Bundle:
    """A built bundle: where it is, its sha256 (its name in the bucket) and what it holds.

    `left_out`: workdir-relative folders and links left out by place (cloudtrain's home, the
    bundles folder), printable (see _shown), for the run's output to mention."""

    path: Path
    sha256: str
    size: int
    wheel_name: str
    version: str
    files: int
    left_out: tuple[str, ...] = ()

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


def _wheel_inputs() -> tuple[str, list[tuple[str, bytes]]]:
    """The wheel's name and its files in order (RECORD last). Pure apart from reads."""
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
        (
            f"{dist_info}/entry_points.txt",
            b"[console_scripts]\ncloudtrain = cloudtrain.cli.main:main\n",
        ),
    ]
    record_lines = []
    for arcname, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{arcname},sha256={digest},{len(data)}")
    record_lines.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record_lines) + "\n").encode()))
    return f"cloudtrain-{version}-py3-none-any.whl", files


def _zip(files: list[tuple[str, bytes]]) -> bytes:
    """The wheel's bytes: a deflated zip with fixed times and modes. Deterministic; pure."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return buf.getvalue()


def build_wheel(cache_dir: Path | None = None) -> tuple[str, bytes]:
    """Build the cloudtrain wheel from the running code: (file name, bytes). Deterministic.

    Deflating the sources (~1.5 MB) is most of a run's bundle time, so with `cache_dir` the
    wheel is kept there under the sha256 of everything it is made from (RECORD holds each
    file's sha256, and the name, version and requirements): the same code gives the same
    bytes, read back instead of deflated again. Only the cache is written (atomically; a
    cache that cannot be written is skipped). Blocks on reads."""
    name, files = _wheel_inputs()
    if cache_dir is None:
        return name, _zip(files)
    # the zlib in use too: another one may deflate the same files into other bytes
    key = hashlib.sha256(f"{name}\n{zlib.ZLIB_RUNTIME_VERSION}\n".encode() + files[-1][1])
    cached = cache_dir / f"{key.hexdigest()}.whl"
    with contextlib.suppress(OSError):
        return name, cached.read_bytes()
    wheel = _zip(files)
    with contextlib.suppress(OSError):
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cached.name}-", suffix=".part", dir=cache_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(wheel)
            os.replace(tmp, cached)  # atomic: a reader sees the whole wheel or none
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _prune_wheels(cache_dir)
    return name, wheel


def _prune_wheels(cache_dir: Path) -> None:
    """Keep the KEEP_WHEELS newest wheels of the cache (each edit of cloudtrain's code makes
    one). A reader racing a delete misses and builds the wheel again. Never raises."""
    with contextlib.suppress(OSError):
        wheels = sorted(cache_dir.glob("*.whl"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in wheels[KEEP_WHEELS:]:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()


_shown = printable  # a name for an error line (cloudtrain.jobspec.yaml_source.printable)


def _real(path: Path) -> Path:
    """The absolute path with every link resolved; never raises (a loop stays unresolved)."""
    return Path(os.path.realpath(path))


def _within(path: Path, folders: Sequence[Path]) -> bool:
    return any(path == f or path.is_relative_to(f) for f in folders)


class _Walk:
    """The files of one workdir (sorted), their total size and what was left out by place.

    Raises SpecError, prefixed with `where` (the field: `FILE:LINE: workdir`), at the first
    entry that breaks the rules in this module's docstring, or when a ceiling is passed."""

    def __init__(
        self, root: Path, where: str, leave_files: set[Path], leave_dirs: Sequence[Path]
    ) -> None:
        self.root, self.where = root, where
        self.leave_files, self.leave_dirs = leave_files, leave_dirs
        self.files: list[tuple[str, Path]] = []
        self.size = 0
        self.left_out: list[str] = []
        for dirpath, dirs, names in os.walk(root, onerror=self._unreadable, followlinks=False):
            here = Path(dirpath)
            dirs[:] = [d for d in sorted(dirs) if self._keep_dir(here / d)]
            for name in sorted(names):
                if not name.endswith(EXCLUDE_SUFFIXES):
                    self._add(here / name)

    def _rel(self, path: Path | str) -> str:
        return Path(path).relative_to(self.root).as_posix()

    def _refuse(
        self, path: Path, problem: str, hint: str = "remove it from the workdir"
    ) -> NoReturn:
        raise SpecError(f"{self.where}: {_shown(self._rel(path))} {problem}", hint=hint)

    def _unreadable(self, exc: OSError) -> None:
        """os.walk's error handler: a folder that cannot be listed is an error, not a skip."""
        where = self._rel(exc.filename) if exc.filename else str(self.root)
        raise SpecError(f"{self.where}: cannot read the folder {_shown(where)}: {exc.strerror}")

    def _link_target(self, path: Path) -> Path:
        """Where the symlink `path` leads, inside the workdir; refuses loops and dangling or
        outside links."""
        shown = _shown(os.readlink(path))
        try:
            # strict: a loop raises ELOOP and a dangling link ENOENT (non-strict returns a path)
            target = Path(os.path.realpath(path, strict=True))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._refuse(path, f"is a symlink loop ({_shown(path.name)} -> {shown} -> ...)")
            if exc.errno == errno.ENOENT:
                self._refuse(path, f"is not a regular file: a symlink to {shown}, which is gone")
            self._refuse(path, f"cannot be read: {exc.strerror}")
        if not target.is_relative_to(self.root):
            self._refuse(
                path,
                f"is a symlink to {_shown(target)}, outside the workdir {_shown(self.root)}",
                hint="copy the file into the workdir or remove the link",
            )
        return target

    def _keep_dir(self, path: Path) -> bool:
        """Whether to walk into `path` (a folder, or a link to one, listed by os.walk)."""
        if path.name in EXCLUDE_DIRS:
            return False
        if path.is_symlink():
            target = self._link_target(path)
            if _within(target, self.leave_dirs):
                self.left_out.append(self._rel(path))
                return False
            self._refuse(path, "links to a folder", hint="replace the link with the folder")
        if _within(path, self.leave_dirs):
            self.left_out.append(self._rel(path))
            return False
        return True

    def _add(self, path: Path) -> None:
        """Take the file `path` (os.walk lists dangling and looping links with the files)."""
        target = self._link_target(path) if path.is_symlink() else path
        if _within(target, self.leave_dirs):
            self.left_out.append(self._rel(path))
            return
        if target in self.leave_files:
            return
        info = os.stat(target)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read
            self._refuse(path, "is not a regular file")
        self.files.append((self._rel(path), path))
        self.size += info.st_size
        if len(self.files) > MAX_BUNDLE_FILES:
            raise SpecError(
                f"{self.where}: {_shown(self.root)} holds more than {MAX_BUNDLE_FILES} files",
                hint=_DATA_HINT,
            )
        if self.size > MAX_BUNDLE_BYTES:
            raise SpecError(
                f"{self.where}: {_shown(self.root)} is larger than"
                f" {MAX_BUNDLE_BYTES // 2**20} MiB (reached at {_shown(self._rel(path))})",
                hint=_DATA_HINT,
            )


class _HashingSink:
    """A write-only file object: hashes and counts what it passes on to `out`."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def _member(
    name: str, size: int = 0, mode: int = 0o644, kind: bytes = tarfile.REGTYPE
) -> tarfile.TarInfo:
    """A tar entry with no time, owner or group: the same bytes on every machine."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime = kind, size, mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _pack_file(tar: tarfile.TarFile, rel: str, path: Path, where: str) -> int:
    """Stream one workdir file into `tar`; returns its size. Raises SpecError."""
    try:
        # O_NONBLOCK: a file swapped for a FIFO since the walk fails the check below, not hangs
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SpecError(f"{where}: {_shown(rel)} cannot be read: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(f"{where}: {_shown(rel)} is not a regular file")
        mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
        try:
            tar.addfile(_member(f"workdir/{rel}", info.st_size, mode), fh)
        except OSError as exc:  # tarfile's "unexpected end of data": it shrank meanwhile
            raise SpecError(
                f"{where}: {_shown(rel)} changed while it was being packed ({exc})",
                hint="run again when nothing is writing into the workdir",
            ) from exc
    return int(info.st_size)


def _write_archive(
    sink: _HashingSink, files: list[tuple[str, Path]], where: str, wheels: Path | None = None
) -> str:
    """Stream the whole archive into `sink` (the wheel from the cache `wheels`, see
    build_wheel); returns the wheel's name. Raises SpecError."""
    wheel_name, wheel = build_wheel(wheels)
    # filename "": no name in the gzip header; mtime 0: the same bytes every time.
    # tar mode "w|": a stream that never seeks, so the sink sees each byte once, in order.
    with (
        gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=sink, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(_member(f"wheel/{wheel_name}", len(wheel)), io.BytesIO(wheel))
        tar.addfile(_member("workdir", mode=0o755, kind=tarfile.DIRTYPE))
        total = 0
        for rel, path in files:
            total += _pack_file(tar, rel, path, where)
            if total > MAX_BUNDLE_BYTES:  # grown since the walk measured it
                raise SpecError(
                    f"{where}: the workdir grew past {MAX_BUNDLE_BYTES // 2**20} MiB while it"
                    " was being packed",
                    hint=_DATA_HINT,
                )
    return wheel_name


def _pack(files: list[tuple[str, Path]], out_dir: Path, where: str) -> tuple[Path, str, int, str]:
    """Write the archive into `out_dir`: (path, sha256, size, wheel name). Blocks; a failure
    or an interrupt leaves no file behind."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # unique per process and per call; in out_dir, so that the rename stays on one disk
        fd, name = tempfile.mkstemp(prefix=f".bundle-{os.getpid()}-", suffix=".part", dir=out_dir)
    except OSError as exc:
        raise UsageError(
            f"cannot write the bundle into {out_dir}: {exc.strerror}",
            hint=f"check ${HOME_ENV} ({cloudtrain_home()})",
        ) from exc
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw:
            sink = _HashingSink(raw)
            wheel_name = _write_archive(sink, files, where, out_dir / WHEEL_CACHE)
            os.fchmod(raw.fileno(), 0o644)
        sha = sink.sha.hexdigest()
        path = out_dir / f"{sha}.tar.gz"
        os.replace(tmp, path)  # atomic; a twin build's file has the same bytes
        return path, sha, sink.size, wheel_name
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def build_bundle(
    workdir: Path, out_dir: Path, leave_out: Sequence[Path] = (), *, where: str = "workdir"
) -> Bundle:
    """Pack `workdir` and the wheel into `out_dir/<sha256>.tar.gz`, without the files in
    `leave_out` (the job spec: it may hold inline secrets, and the nodes get cluster.json
    instead) and without cloudtrain's home or `out_dir` where they are inside the workdir.

    Raises SpecError (its message starts with `where`, the field that names the workdir) for a
    workdir that breaks a rule of this module, before anything is written; UsageError when
    `out_dir` cannot be written. Deterministic; idempotent; safe to call from several processes
    at once. Blocks while it streams the files."""
    if not workdir.is_dir():
        raise SpecError(f"{where}: {_shown(workdir)} does not exist or is not a folder")
    root = _real(workdir)
    home, bundles = _real(cloudtrain_home()), _real(out_dir)
    if root == home or _within(root, [bundles]):
        raise SpecError(
            f"{where}: {_shown(root)} is cloudtrain's own"
            f" {'home' if root == home else 'bundles folder'}"
            " (its ledger, bundles and runs are never shipped)",
            hint=f"point workdir at the job's code; ${HOME_ENV} sets where cloudtrain keeps state",
        )
    # only what is inside the workdir: a workdir may well be a folder in cloudtrain's home
    inside = [d for d in (home, bundles) if d.is_relative_to(root)]
    walk = _Walk(root, where, {_real(p) for p in leave_out}, inside)
    if not walk.files:
        also = f"; left out: {', '.join(map(_shown, walk.left_out))}" if walk.left_out else ""
        raise SpecError(
            f"{where}: {_shown(root)} has nothing to ship: no file besides the job spec and the"
            f" names left out ({', '.join(sorted(EXCLUDE_DIRS))}, *.pyc){also}",
            hint="put the job's code in the workdir, or set workdir to the folder that holds it",
        )
    path, sha, size, wheel_name = _pack(walk.files, out_dir, where)
    version = cloudtrain.__version__
    left_out = tuple(sorted(map(_shown, walk.left_out)))
    return Bundle(path, sha, size, wheel_name, version, len(walk.files), left_out)


def workdir_field(spec: JobSpec) -> str:
    """How errors name the spec's `workdir` field: `FILE:LINE: workdir` when the file sets it,
    else `FILE: workdir` (the default, '.'), else `workdir`. Pure."""
    at = spec.where("workdir")
    if at:
        return f"{at}: workdir"
    return f"{spec.source_path}: workdir" if spec.source_path else "workdir"


def build_spec_bundle(spec: JobSpec, out_dir: Path) -> Bundle:
    """The bundle of a job spec: its workdir without the spec file itself (see build_bundle;
    errors name the spec's `workdir` field). Deterministic; idempotent; blocks."""
    leave_out = [spec.source_path] if spec.source_path else []
    return build_bundle(spec.workdir_path(), out_dir, leave_out, where=workdir_field(spec))
