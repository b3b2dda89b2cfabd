"""The downloaded datasets where they live: a local folder (plain files) or an object store
(`s3://bucket/prefix`, through fsspec). Readers and decoders open, list, fingerprint and
confine source files through this module only.

A local path keeps the fast path (plain `open`, `scandir`, real-path confinement). A store
path is a `UPath`: it pickles as URL + options, so each worker process (pool or Dask) makes
its own client — s3fs clients must not cross a fork.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from upath import UPath

from radharmony_pipeline.processing.execution.parallel import map_on_file_system
from radharmony_pipeline.processing.storage.fingerprint import file_sha256
from radharmony_pipeline.processing.storage.retry_policy import (
    DEFAULT_RETRY_POLICY,
    ObjectStoreError,
    RetryPolicy,
    is_local,
    with_retries,
)
from radharmony_pipeline.processing.storage.store import output_path, read_bytes

SourcePath = Path | UPath
# (size, modification time in ns) of a local file; (size, ETag) of an object.
FileState = tuple[int, int | str]

# Header reads (image sizes, DICOM tags) fetch this much per request instead of the object.
HEADER_BLOCK = 64 << 10
_FIX = (
    "Check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), that the store is up and reachable, and "
    "the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); the dataset's location comes "
    "from RADHARMONY_DATA_ROOT or the dataset's own variable"
)


# A local folder with at least this many named files is listed once instead of a stat each.
LISTED_FOLDER_MIN_NAMES = 8


class SourceStoreError(ObjectStoreError):
    """The object store holding a dataset cannot be used (endpoint unreachable or timing out,
    no credentials). Not a problem of one file: it stops the step instead of becoming error
    rows, which would mark every image of the partition unreadable."""


class ObjectNotFound(FileNotFoundError):
    """A source object that is not on the store (a FileNotFoundError, like a local file)."""

    def __str__(self) -> str:
        return (
            f"{self.filename}: object not found on the store; upload it, or point the "
            "dataset's location (RADHARMONY_DATA_ROOT or its own variable) at the prefix "
            "that holds it"
        )


class NotARegularFile(OSError):
    """A local path that is a named pipe, socket, device or folder where a file should be.

    Refused from its metadata alone: opening a FIFO waits for a writer that may never come,
    and opening a device can block or have side effects."""

    def __init__(self, path: SourcePath, kind: str) -> None:
        self.reason = (
            f"is a {kind}, not a regular file; it was not opened. Replace it with the file itself"
        )
        super().__init__(errno.EINVAL, self.reason, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.reason}"


_KINDS = (
    (stat.S_ISFIFO, "named pipe (FIFO)"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISDIR, "folder"),
)


def require_regular_mode(path: SourcePath, mode: int) -> None:
    """Raise NotARegularFile unless `mode` (a stat's st_mode) is a regular file's."""
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "special file")
        raise NotARegularFile(path, kind)


def require_regular_file(path: SourcePath) -> None:
    """Raise FileNotFoundError or NotARegularFile unless the local `path` is a regular file
    (through symlinks); nothing is opened. An object on a store is always a plain file."""
    if not is_local(path):
        return
    try:
        mode = os.stat(path).st_mode
    except (NotADirectoryError, ValueError) as error:  # a path through a file, a NUL byte
        raise FileNotFoundError(errno.ENOENT, "file not found", str(path)) from error
    require_regular_mode(path, mode)


def _open_local(path: SourcePath) -> BinaryIO:
    """A local regular file opened for reading; anything else is refused before opening."""
    require_regular_file(path)
    # Non-blocking, so that a file swapped for a FIFO after the check cannot hang the open;
    # the descriptor's own type is checked again before it is used.
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        require_regular_mode(path, os.fstat(descriptor).st_mode)
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, "rb")


def source_path(
    location: str | os.PathLike, retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY
) -> SourcePath:
    """A dataset location as a local Path, or a UPath for a URL (`s3://bucket/prefix`) whose
    requests follow `retry_policy` (the output root's layer: storage.py)."""
    return output_path(location, retry_policy)


def as_source_path(path: Any) -> SourcePath:
    """`path` unchanged when it is a UPath or a Path (not parsed again), else as a local
    Path."""
    return path if isinstance(path, (UPath, Path)) else Path(path)


def is_remote(path: Any) -> bool:
    return not is_local(path)


# --- discovery -------------------------------------------------------------------------------


def exists(path: SourcePath) -> bool:
    with _store_errors(path):
        return with_retries(path, "look up the object", path.exists)


def is_file(path: SourcePath) -> bool:
    with _store_errors(path):
        return with_retries(path, "look up the object", path.is_file)


def is_dir(path: SourcePath) -> bool:
    """A local folder, or a prefix with at least one object below it."""
    with _store_errors(path):
        return with_retries(path, "list the prefix", path.is_dir)


def glob(folder: SourcePath, pattern: str) -> list[SourcePath]:
    with _store_errors(folder):
        return with_retries(folder, "list the prefix", lambda: list(folder.glob(pattern)))


# --- reading ---------------------------------------------------------------------------------


@contextlib.contextmanager
def open_source_file(path: SourcePath) -> Iterator[BinaryIO]:
    """A binary handle on the file; an object is fetched in HEADER_BLOCK ranges as read, so
    a parser that stops after the header downloads little."""
    if is_local(path):
        with _open_local(path) as handle:
            yield handle
        return
    with _store_errors(path):
        size = with_retries(path, "look up the object", lambda: path.fs.size(path.path))
    with io.BufferedReader(_ObjectRanges(path, size), HEADER_BLOCK) as handle, _store_errors(path):
        yield handle


class _ObjectRanges(io.RawIOBase):
    """An object read by byte ranges, each range one request under the retry policy (so a
    connection cut mid-header is retried like any other request)."""

    def __init__(self, path: UPath, size: int) -> None:
        self.path, self.size, self.position = path, size, 0
        self.name = str(path)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        end = min(self.position + len(buffer), self.size)
        if end <= self.position:
            return 0
        start = self.position
        data = with_retries(
            self.path,
            "read the object",
            lambda: self.path.fs.cat_file(self.path.path, start=start, end=end),
        )
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def read_source_bytes(path: SourcePath) -> bytes:
    """The whole file: one request (a GET) for an object (store.read_bytes)."""
    if is_local(path):
        with _open_local(path) as handle:
            return handle.read()
    with _store_errors(path):
        return read_bytes(path)


class FileContent(io.BytesIO):
    """A file's bytes in memory, named like the file so parsers' messages name it too."""

    def __init__(self, content: bytes, path: SourcePath) -> None:
        super().__init__(content)
        self.name = str(path)

    def __repr__(self) -> str:
        return repr(self.name)


def readable(path: SourcePath, content: bytes | None = None) -> Path | BinaryIO:
    """What a parser (Pillow, pydicom) should open: `content` when the caller already read
    the file, a local file by its path (the fast path), else the object's bytes in memory.
    A missing file raises FileNotFoundError naming it, a FIFO or device NotARegularFile."""
    if content is not None:
        return FileContent(content, path)
    if is_local(path):
        require_regular_file(path)
        return Path(path)
    return FileContent(read_source_bytes(path), path)


# --- fingerprints ----------------------------------------------------------------------------


def file_state(path: SourcePath) -> FileState:
    """What changes when the file is replaced: (size, mtime) locally, (size, ETag) on a store
    (one metadata request, no read)."""
    if is_local(path):
        stat = os.stat(path)
        return stat.st_size, stat.st_mtime_ns
    with _store_errors(path):
        return _object_state(
            with_retries(path, "look up the object", lambda: path.fs.info(path.path))
        )


def annotation_fingerprint(path: SourcePath) -> str | None:
    """Content hash of a local annotation file; size + ETag of an object (a 200 MB JSON is
    not downloaded to be observed); None when absent."""
    if is_local(path):
        return file_sha256(path) if path.is_file() else None
    try:
        size, etag = file_state(path)
    except FileNotFoundError:
        return None
    return f"etag:{etag}:{size}"


def tree_states(folder: SourcePath, suffixes: Iterable[str]) -> dict[str, FileState]:
    """Every file below `folder` with one of `suffixes` (lower case), by its '/'-separated
    name relative to `folder`: a directory walk locally, one listing on a store."""
    suffixes = tuple(suffixes)
    if is_remote(folder):
        return {
            name: state
            for name, state in _listing(folder).items()
            if posixpath.splitext(name)[1].lower() in suffixes
        }
    names = [
        name for name in _local_tree(folder) if posixpath.splitext(name)[1].lower() in suffixes
    ]
    states = map_on_file_system(_local_state, [os.path.join(folder, name) for name in names])
    return {name: state for name, state in zip(names, states, strict=True) if state is not None}


def _local_tree(folder: Path) -> list[str]:
    """The files below `folder` by '/'-separated relative name, as `os.walk` finds them (a
    symbolic link to a folder is not followed; an unreadable folder is skipped), listed a
    level at a time so that the folders of one level are read together (map_on_file_system):
    CheXpert keeps each study in its own patient and study folders, each folder a disk read
    on a cold tree."""
    files: list[str] = []
    level = [""]
    while level:
        listings = map_on_file_system(_entries, [os.path.join(folder, name) for name in level])
        next_level = []
        for parent, (subfolders, names) in zip(level, listings, strict=True):
            prefix = f"{parent}/" if parent else ""
            next_level += [prefix + name for name in subfolders]
            files += [prefix + name for name in names]
        level = next_level
    return files


def _entries(folder: str) -> tuple[list[str], list[str]]:
    """The folders (not links to folders) and the other entries of `folder`; none when it
    cannot be listed."""
    subfolders, names = [], []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.is_dir():
                    names.append(entry.name)
                elif not entry.is_symlink():
                    subfolders.append(entry.name)
    except OSError:
        pass
    return subfolders, names


def named_states(folder: SourcePath, names: Iterable[str]) -> dict[str, FileState]:
    """The files among `names` (relative to `folder`) that exist: a stat each locally (on
    threads while the tree is read from the disk, see map_on_file_system), one listing of
    `folder` on a store instead of a request per name."""
    if is_remote(folder):
        listed = _listing(folder)
        return {name: listed[name] for name in names if name in listed}
    names = list(names)
    states = map_on_file_system(_local_state, [os.path.join(folder, name) for name in names])
    return {name: state for name, state in zip(names, states, strict=True) if state is not None}


# The errors by which a stat says nothing is there (those Path.exists answers False for).
_NOTHING_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _local_state(path: str) -> FileState | None:
    """Size and modification time; none where nothing is."""
    try:
        stat = os.stat(path)
    except OSError as error:
        if error.errno in _NOTHING_THERE:
            return None
        raise
    return (stat.st_size, stat.st_mtime_ns)


def existing_names(folder: SourcePath, names: Iterable[str]) -> set[str]:
    """The files among `names` (relative to `folder`) that exist, without a request per name
    on a store (one listing of the prefix). Locally a folder holding many named files is
    listed once; a name alone in its folder (ReXGradient: one image per folder) is a stat,
    measured ~4x faster than listing its folder (`bench_checks.py --section data`). A name
    whose first component is not in `folder` at all is missing without a stat: one listing
    of `folder` answers for every name under a top folder the download lacks (metadata
    fetched first, a partial download)."""
    if is_remote(folder):
        listed = _listing(folder)
        return {name for name in names if name in listed}
    top = _folder_entries(folder)
    by_folder: dict[str, list[str]] = {}
    for name in names:
        if name.partition("/")[0] in top:
            by_folder.setdefault(name.rpartition("/")[0], []).append(name)
    found = set()
    stated = []
    for parent, members in by_folder.items():
        if len(members) < LISTED_FOLDER_MIN_NAMES:
            stated += members
            continue
        # Names directly in `folder` (ChestX-Det) are answered by the listing above.
        entries = top if parent == "" else _folder_entries(os.path.join(folder, parent))
        found.update(name for name in members if entries.get(name.rpartition("/")[2]) is False)
    # On threads while the disk is read (see named_states).
    files = map_on_file_system(os.path.isfile, [os.path.join(folder, name) for name in stated])
    return found.union(name for name, is_file in zip(stated, files, strict=True) if is_file)


def _folder_entries(folder: SourcePath) -> dict[str, bool]:
    """Each name directly in a local folder, and whether it is a folder itself; none when
    the folder is missing or not a folder."""
    try:
        with os.scandir(folder) as entries:
            return {entry.name: entry.is_dir() for entry in entries}
    except (FileNotFoundError, NotADirectoryError):
        return {}


def _listing(folder: UPath) -> dict[str, FileState]:
    base = folder.path.rstrip("/")
    with _store_errors(folder):
        found = with_retries(folder, "list the prefix", lambda: folder.fs.find(base, detail=True))
    return {
        key[len(base) + 1 :]: _object_state(info)
        for key, info in found.items()
        if info.get("type") != "directory" and key.startswith(base + "/")
    }


def _object_state(info: dict) -> FileState:
    # Stores without ETags (rare) still give a modification time.
    tag = info.get("ETag") or info.get("etag") or str(info.get("LastModified", ""))
    return int(info.get("size") or 0), str(tag).strip('"')


# --- confinement -----------------------------------------------------------------------------


def key_problem(path: UPath, root: SourcePath) -> str | None:
    """Why an object path is not inside the dataset folder `root`, or None.

    Object stores have no symlinks; what can leave a prefix is the key's text: a `..`
    segment (S3 keeps it literally, other stores resolve it), an empty segment (an absolute
    path joined to the folder), a key that normalizes to somewhere else, or another store or
    bucket altogether.
    """
    if is_local(root) or getattr(path, "protocol", None) != root.protocol:
        return f"is not on the dataset's object store ({root})"
    key, base = path.path, root.path.rstrip("/")
    segments = key.split("/")
    if ".." in segments:
        return f"has a '..' segment; keys are confined to {root}"
    if "" in segments:
        return f"has an empty segment (an absolute path?); keys are confined to {root}"
    normalized = posixpath.normpath(key)
    if not normalized.startswith(base + "/"):
        return f"normalizes to {normalized}, outside the image folder {root}"
    return None


# --- errors ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _store_errors(path: SourcePath) -> Iterator[None]:
    """On a store: a missing object stays FileNotFoundError, naming its URL; connection
    problems, timeouts and missing credentials become SourceStoreError with the fix. Local
    errors pass unchanged."""
    if is_local(path):
        yield
        return
    try:
        yield
    except SourceStoreError:
        raise
    except ObjectStoreError as error:  # permanent, or faults past the retry policy
        raise SourceStoreError(_store_message(path, error)) from error
    except ObjectNotFound:
        raise
    except FileNotFoundError as error:
        raise ObjectNotFound(errno.ENOENT, "object not found", str(path)) from error
    except TimeoutError as error:  # an OSError, but about the store, not the file
        raise SourceStoreError(_store_message(path, error)) from error
    except (OSError, ValueError):
        raise  # about this object (access denied, ...): the caller reports the file
    except Exception as error:
        if type(error).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp"):
            raise SourceStoreError(_store_message(path, error)) from error
        raise


def _store_message(path: UPath, error: Exception) -> str:
    endpoint = path.storage_options.get("client_kwargs", {}).get("endpoint_url")
    where = f" at {endpoint}" if endpoint else ""
    return f"{path}: cannot use the object store{where}: {error}. {_FIX}"
