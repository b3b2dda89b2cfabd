"""Crash-safe writing: files go to a temporary name first, datasets to a staging folder."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

# Left in every root the generator publishes, so a re-run may replace it but never real data.
MARKER_NAME = ".radharmony_synthetic"
_MARKER_TEXT = "written by radharmony_pipeline.synthetic; safe to delete or regenerate\n"


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def write_text(path: Path, text: str) -> None:
    """Write UTF-8 `text` to `path` atomically."""
    write_bytes(path, text.encode("utf-8"))


def write_text_chunks(path: Path, chunks: Iterable[str]) -> None:
    """Stream UTF-8 `chunks` to `path` atomically, for files too big to build in memory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8", newline="") as handle:
        for chunk in chunks:
            handle.write(chunk)
    os.replace(temporary, path)


@contextmanager
def staged_roots(out: Path, name: str, roots: Sequence[str]) -> Iterator[Path]:
    """Yield a staging folder shaped like `out`; on success swap its `roots` into `out`.

    A crash leaves the previous roots untouched and only a hidden staging folder behind.
    """
    for root in roots:
        _check_replaceable(out / root)
    staging = out / f".{name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        for root in roots:
            _swap_in(staging / root, out / root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_replaceable(target: Path) -> None:
    if target.is_dir() and any(target.iterdir()) and not (target / MARKER_NAME).exists():
        raise FileExistsError(
            f"{target} holds files the synthetic generator did not write; refusing to replace "
            f"them. Generate into an empty folder, or delete {target} first."
        )


def _swap_in(new: Path, target: Path) -> None:
    write_text(new / MARKER_NAME, _MARKER_TEXT)
    retired = target.with_name(f".{target.name}.old")
    shutil.rmtree(retired, ignore_errors=True)
    if target.exists():
        os.replace(target, retired)
    os.replace(new, target)
    shutil.rmtree(retired, ignore_errors=True)
