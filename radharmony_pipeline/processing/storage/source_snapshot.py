"""What a partition's downloaded files looked like when observed, and what changed since.

A snapshot holds the content hash of every annotation file and the (size, modification time)
of every image — never pixels, so observing 270K images costs a directory walk (on an object
store, sizes and ETags from one listing per prefix; nothing is downloaded). The data version
of a partition is derived from it, and the previous snapshot is kept beside the outputs so
the next observation can name the files added, removed or modified.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from radharmony_pipeline.processing.storage.fingerprint import combined_version, entries_fingerprint
from radharmony_pipeline.processing.storage.source_store import (
    FileState,
    SourcePath,
    annotation_fingerprint,
)
from radharmony_pipeline.processing.storage.store import open_for_reading, publish_bytes

ABSENT = "absent"
SNAPSHOT_FORMAT = 1


@dataclass(frozen=True)
class SourceSnapshot:
    """Annotation file name -> sha256 (or "absent"); image name -> (size, mtime in ns).
    On an object store: "etag:<ETag>:<size>" and (size, ETag)."""

    annotations: Mapping[str, str]
    images: Mapping[str, FileState]
    # Why the image tree could not be listed ("absent: <folder>", "unreadable: <reason>").
    image_tree_problem: str | None = None

    def data_version(self) -> str:
        parts = [
            digest if digest != ABSENT else f"absent:{name}"
            for name, digest in self.annotations.items()
        ]
        parts.append(self.image_tree_problem or entries_fingerprint(self.images))
        return combined_version(parts)


def hash_annotation_files(paths: Iterable[SourcePath], root: SourcePath) -> dict[str, str]:
    """Name (relative to the dataset root when inside it) -> fingerprint, or "absent"."""
    return {_display_name(path, root): annotation_fingerprint(path) or ABSENT for path in paths}


def _display_name(path: SourcePath, root: SourcePath) -> str:
    try:
        return path.relative_to(root).as_posix()
    except (ValueError, TypeError):  # outside the root, or on another store
        return str(path)


@dataclass(frozen=True)
class FileChanges:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.added) + len(self.removed) + len(self.modified)


def compare(previous: Mapping[str, object], current: Mapping[str, object]) -> FileChanges:
    """Names added, removed and modified between two name -> state mappings (sorted)."""
    return FileChanges(
        added=sorted(current.keys() - previous.keys()),
        removed=sorted(previous.keys() - current.keys()),
        modified=sorted(
            name for name in current.keys() & previous.keys() if current[name] != previous[name]
        ),
    )


def describe_changes(annotations: FileChanges, images: FileChanges, examples: int = 3) -> str:
    """One line a person reads first: which annotation files and how many images changed."""
    if not annotations.count and not images.count:
        return "unchanged since the previous observation"
    parts = []
    for verb, names in (
        ("modified", annotations.modified),
        ("added", annotations.added),
        ("removed", annotations.removed),
    ):
        if names:
            parts.append(f"annotation file(s) {verb}: {', '.join(names)}")
    for verb, names in (
        ("added", images.added),
        ("removed", images.removed),
        ("modified", images.modified),
    ):
        if names:
            shown = ", ".join(names[:examples]) + (", …" if len(names) > examples else "")
            parts.append(f"{len(names)} image(s) {verb} ({shown})")
    return "; ".join(parts)


# A snapshot is mostly UIDs, which compress little at any level: the fastest level costs a few
# percent more bytes and a fraction of the time of gzip's default (benchmarks/README.md).
SNAPSHOT_COMPRESSION = 1


def save_snapshot(snapshot: SourceSnapshot, path: Any) -> None:
    payload = {
        "format": SNAPSHOT_FORMAT,
        "annotations": dict(snapshot.annotations),
        "images": {name: list(state) for name, state in snapshot.images.items()},
        "image_tree_problem": snapshot.image_tree_problem,
    }
    text = json.dumps(payload, separators=(",", ":")).encode("utf-8")
    publish_bytes(path, gzip.compress(text, compresslevel=SNAPSHOT_COMPRESSION, mtime=0))


def load_snapshot(path: Any) -> SourceSnapshot | None:
    """The snapshot saved at `path`, or None when there is none (or it is unreadable)."""
    try:
        with open_for_reading(path) as raw, gzip.open(raw, "rt", encoding="utf-8") as handle:
            payload = json.load(handle)
    except (OSError, EOFError, ValueError):
        return None
    if payload.get("format") != SNAPSHOT_FORMAT:
        return None
    return SourceSnapshot(
        annotations=payload["annotations"],
        images={name: (size, version) for name, (size, version) in payload["images"].items()},
        image_tree_problem=payload.get("image_tree_problem"),
    )
