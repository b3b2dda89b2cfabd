"""The folder layouts real downloads unpack to, mapped onto the folders the readers expect.

Each finder takes what the user gave (or the data-root default) and returns the folder to
read with a note saying why it differs from the given one; when nothing fits, the given
folder is kept so the reader's error names it, and `nearby` says what is there instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..processing.storage import source_store
from ..processing.storage.source_store import SourcePath

# PhysioNet's `wget -r` writes physionet.org/files/<project>/<version>/...
PHYSIONET_HOST = "physionet.org"
MIMIC_PROJECTS = ("mimic-cxr-jpg", "mimic-cxr")
MS_CXR_PROJECT = "ms-cxr"
_VERSION = re.compile(r"^\d+(?:\.\d+)*$")
NEARBY_SHOWN = 12


@dataclass(frozen=True)
class Found:
    """A folder chosen for the reader, and why it is not the folder given (None: it is)."""

    path: SourcePath
    note: str | None = None


def physionet_release(folder: SourcePath, projects: Sequence[str]) -> SourcePath | None:
    """The newest `<project>/<version>/` of a PhysioNet `wget -r` tree, given the folder that
    holds `physionet.org/`, `physionet.org/` itself, its `files/`, or the project folder."""
    for project in projects:
        for base in (
            folder / PHYSIONET_HOST / "files" / project,
            folder / "files" / project,
            folder / project,
            folder,
        ):
            if base.name != project or not source_store.is_dir(base):
                continue
            versions = [
                child
                for child in _children(base)
                if _VERSION.match(child.name) and source_store.is_dir(child)
            ]
            if versions:
                return max(versions, key=lambda path: tuple(map(int, path.name.split("."))))
    return None


def mimic_files_dir(given: SourcePath | None, data_root: SourcePath) -> Found:
    """MIMIC-CXR's `files/` (pNN folders): given as `files/` itself, as its parent, as a
    PhysioNet tree, or under `<data root>/mimic-cxr/`."""
    if given is not None:
        return _mimic_files_in(given) or Found(given)
    default = data_root / "mimic-cxr" / "files"
    if source_store.is_dir(default):
        return Found(default)
    for base in (data_root / "mimic-cxr", data_root):
        found = _mimic_files_in(base)
        if found is not None and found.path != default:
            return found
    return Found(default)


def _mimic_files_in(folder: SourcePath) -> Found | None:
    if _is_files_folder(folder):
        return Found(folder)
    release = physionet_release(folder, MIMIC_PROJECTS)
    if release is not None and source_store.is_dir(release / "files"):
        return Found(release / "files", _note(release / "files", "a PhysioNet wget tree"))
    if _is_files_folder(folder / "files"):
        return Found(folder / "files", _note(folder / "files", "the folder that holds files/"))
    return None


def _is_files_folder(folder: SourcePath) -> bool:
    """MIMIC's files/ holds p10 ... p19 (some copies only a few); a folder named `files`
    counts too, unless it is PhysioNet's own `physionet.org/files/`."""
    if any(source_store.is_dir(folder / f"p{group}") for group in range(10, 20)):
        return True
    return (
        folder.name == "files"
        and folder.parent.name != PHYSIONET_HOST
        and source_store.is_dir(folder)
    )


def ms_cxr_csv_folder(given: SourcePath | None, data_root: SourcePath) -> Found:
    """The folder to look for the MS-CXR CSV in when no CSV file is given: the folder given
    (the CSV variable may name one), `<data root>/ms-cxr/`, or a PhysioNet tree of ms-cxr."""
    folder = given or data_root / "ms-cxr"
    release = physionet_release(folder, (MS_CXR_PROJECT,))
    if release is None and given is None and not source_store.is_dir(folder):
        release = physionet_release(data_root, (MS_CXR_PROJECT,))
    if release is not None:
        return Found(release, _note(release, "a PhysioNet wget tree"))
    return Found(folder)


def chestx_det_image_dir(root: SourcePath, split: str) -> Found:
    """`<root>/<split>/`, or the zips' `<split>_data/<split>/` (or `<split>_data/`)."""
    canonical = root / split
    if source_store.is_dir(canonical):
        return Found(canonical)
    for candidate in (root / f"{split}_data" / split, root / f"{split}_data"):
        if source_store.is_dir(candidate) and source_store.glob(candidate, "*.png"):
            return Found(candidate, _note(candidate, f"the unzipped {split}_data.zip"))
    return Found(canonical)


def chexlocalize_folders(root: SourcePath) -> tuple[SourcePath, SourcePath, str | None]:
    """(dataset root, its CheXpert/ folder, note): the root may be given as CheXpert/ itself."""
    chexpert = root / "CheXpert"
    if source_store.is_dir(chexpert) or not _looks_like_chexpert(root):
        return root, chexpert, None
    return root.parent, root, _note(root, "the CheXpert/ folder itself; the root is its parent")


def _looks_like_chexpert(folder: SourcePath) -> bool:
    return folder.name.lower().startswith("chexpert") or any(
        source_store.is_file(folder / f"{split}_labels.csv") for split in ("val", "test")
    )


def chexlocalize_image_dir(chexpert: SourcePath, split: str) -> Found:
    """`CheXpert/<split>/`; the val images may sit in CheXpert's own `valid/` folder name."""
    canonical = chexpert / split
    if split == "val" and not source_store.is_dir(canonical):
        valid = chexpert / "valid"
        if source_store.is_dir(valid):
            return Found(valid, _note(valid, "CheXpert's valid/ folder name"))
    return Found(canonical)


def rexgradient_folders(
    root: SourcePath | None, images: SourcePath | None, data_root: SourcePath
) -> tuple[SourcePath, SourcePath, str | None]:
    """(dataset root, deid_png/ folder, note): the root may be given as `deid_png/` itself or
    as the `download/` folder of `hf download --local-dir`, with `deid_png/` beside it."""
    if images is not None:
        return root or images.parent, images, None
    root = root or data_root / "rexgradient"
    if source_store.is_dir(root / "deid_png"):
        return root, root / "deid_png", None
    if root.name == "deid_png" and source_store.is_dir(root):
        return root.parent, root, _note(root, "deid_png/ itself; the root is its parent")
    beside = root.parent / "deid_png"
    if root.name == "download" and source_store.is_dir(beside):
        return root.parent, beside, _note(beside, "deid_png/ beside the download/ folder")
    return root, root / "deid_png", None


def rexgradient_metadata_folders(root: SourcePath, images: SourcePath) -> list[SourcePath]:
    """Where the metadata JSONs may be, in order: `download/metadata/`, `metadata/`, either
    beside `deid_png/`, or the root itself."""
    folders = [
        root / "download" / "metadata",
        root / "metadata",
        images.parent / "download" / "metadata",
        images.parent / "metadata",
        root,
    ]
    return list(dict.fromkeys(folders))


def nearby(path: SourcePath) -> str:
    """What is at the closest existing, non-empty folder above `path` (or in it), for an error
    message."""
    folder = path
    for _ in range(4):
        if source_store.is_dir(folder) and _children(folder):
            break
        if folder.parent == folder:
            return ""
        folder = folder.parent
    else:
        return ""
    try:
        children = sorted(_children(folder), key=lambda child: child.name)
    except OSError:
        return ""
    names = [
        child.name + ("/" if source_store.is_dir(child) else "")
        for child in children
        if not child.name.startswith(".")
    ]
    if not names:
        return f"{folder} is empty"
    more = f", ... ({len(names) - NEARBY_SHOWN} more)" if len(names) > NEARBY_SHOWN else ""
    return f"{folder} holds: {', '.join(names[:NEARBY_SHOWN])}{more}"


def _children(folder: SourcePath) -> list[SourcePath]:
    return source_store.glob(folder, "*")


def _note(path: SourcePath, why: str) -> str:
    return f"using {path} ({why})"
