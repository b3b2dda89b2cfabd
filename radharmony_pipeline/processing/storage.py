"""The output root, a local folder or an object-store URL (`s3://bucket/prefix`), as one layer.

Local roots are plain `Path`s (atomic rename, memory maps); anything with a scheme is a
universal-pathlib `UPath` over fsspec. A `UPath` pickles as its URL and options only, so each
worker process (pool or Dask) creates its own filesystem client on first use — s3fs clients
must not cross a fork. `AWS_ENDPOINT_URL` selects an S3-compatible endpoint (botocore reads
it), and the standard AWS variables carry the credentials.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from upath import UPath

from .atomic import TEMP_MARKER, temporary_sibling, write_atomically

OutputPath = Path | UPath
Writer = Callable[[BinaryIO], None]


def output_path(root: str | os.PathLike) -> OutputPath:
    """`root` as a Path (local folder or file:// URL) or a UPath (any other scheme)."""
    text = str(root)
    if "://" not in text:
        return Path(text)
    if text.startswith("file://"):
        return Path(text.removeprefix("file://"))
    return UPath(text, **_storage_options(text))


def _storage_options(url: str) -> dict[str, Any]:
    # botocore honours AWS_ENDPOINT_URL itself; passing it explicitly also covers older
    # aiobotocore releases that predate that variable.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if url.startswith(("s3://", "s3a://")) and endpoint:
        return {"client_kwargs": {"endpoint_url": endpoint}}
    return {}


def is_local(path: Any) -> bool:
    return not isinstance(path, UPath) or path.protocol in ("", "file", "local")


def publish(path: OutputPath, write: Writer) -> None:
    """Write through `write(handle)` so no reader ever sees a partial object.

    Local: a temporary sibling renamed into place. Object stores have no rename, and a
    multipart upload can be left half-done by a killed worker: the object is written under a
    temporary key, then copied to its name and the temporary key deleted.
    """
    if is_local(path):
        write_atomically(Path(path), lambda temp: _write_file(temp, write))
        return
    temp = temporary_sibling(path)
    try:
        with temp.open("wb") as handle:
            write(handle)
        temp.fs.mv(temp.path, path.path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.fs.rm(temp.path)
        raise


def publish_file(path: OutputPath, local_file: Path) -> None:
    """Publish a finished local file at `path` (a rename locally, one upload otherwise)."""
    if is_local(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        os.replace(local_file, path)
        return

    def upload(handle: BinaryIO) -> None:
        with open(local_file, "rb") as source:
            shutil.copyfileobj(source, handle, length=8 << 20)

    publish(path, upload)


@contextlib.contextmanager
def local_scratch_file(path: OutputPath, suffix: str = "") -> Iterator[Path]:
    """A local file to assemble `path` in: its temporary sibling on a local root (so the
    final rename stays on one filesystem), else a file in the system's temp folder."""
    if is_local(path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        scratch = temporary_sibling(Path(path))
    else:
        handle, name = tempfile.mkstemp(prefix=TEMP_MARKER, suffix=suffix)
        os.close(handle)
        scratch = Path(name)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)


def _write_file(temp: Path, write: Writer) -> None:
    with open(temp, "wb") as handle:
        write(handle)


def listing(folder: OutputPath) -> set[str]:
    """Paths (relative to `folder`, '/'-separated) of every file below it, in one listing
    request on object stores rather than one existence check per file. Empty if absent."""
    if is_local(folder):
        folder = Path(folder)
        if not folder.is_dir():
            return set()
        return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    base = folder.path.rstrip("/")
    try:
        found = folder.fs.find(base, detail=True)
    except FileNotFoundError:
        return set()
    return {
        key[len(base) + 1 :]
        for key, info in found.items()
        if info.get("type") != "directory" and key.startswith(base + "/")
    }


def make_folder(folder: OutputPath) -> None:
    """Create a local folder; object stores have no folders to create."""
    if is_local(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
