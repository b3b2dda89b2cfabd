"""confined_state: a source's state once its path is known to stay inside the image folder,
the same as confining it and then asking the file, with one lookup where the kernel can."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from radharmony_pipeline.processing.imaging import image_files
from radharmony_pipeline.processing.imaging.image_files import (
    ImageFileError,
    confined,
    confined_state,
)
from radharmony_pipeline.processing.storage.source_store import file_state


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """An image folder with a file eight folders deep, and a folder outside it."""
    root = tmp_path / "deid_png"
    deep = root.joinpath("patient", "accession", "studies", "s1", "series", "r1", "instances")
    deep.mkdir(parents=True)
    (deep / "image.png").write_bytes(b"inside" * 10)
    outside = tmp_path / "outside"
    (outside / "instances").mkdir(parents=True)
    (outside / "instances" / "image.png").write_bytes(b"outside")
    return root, outside


def _deep(root: Path) -> Path:
    return root / "patient/accession/studies/s1/series/r1/instances/image.png"


def test_a_file_inside_has_the_state_of_the_file(tree):
    root, _outside = tree
    assert confined_state(_deep(root), root) == file_state(_deep(root))


@pytest.mark.parametrize(
    "link",
    ["relative", "absolute"],
)
def test_symlinks_that_stay_inside_are_followed_as_before(tree, link):
    root, _outside = tree
    alias = root / "patient" / "alias"
    target = root / "patient" / "accession"
    alias.symlink_to(os.path.relpath(target, alias.parent) if link == "relative" else target)
    path = alias / "studies/s1/series/r1/instances/image.png"
    assert confined_state(path, root) == file_state(_deep(root))
    dotted = root / "patient" / "accession" / ".." / "accession" / "studies/s1/series/r1"
    assert confined_state(dotted / "instances/image.png", root) == file_state(_deep(root))


@pytest.mark.parametrize("level", ["file", "folder", "parent of the root's child"])
def test_a_symlink_leaving_the_folder_is_refused_as_confined_refuses_it(tree, level):
    root, outside = tree
    instances = root / "patient/accession/studies/s1/series/r1/instances"
    if level == "file":
        path = instances / "linked.png"
        path.symlink_to(outside / "instances" / "image.png")
    elif level == "folder":
        (root / "patient" / "linked").symlink_to(outside)
        path = root / "patient" / "linked" / "instances" / "image.png"
    else:
        (root / "linked").symlink_to(os.path.relpath(outside, root))
        path = root / "linked" / "instances" / "image.png"
    with pytest.raises(ImageFileError) as expected:
        confined(path, root)
    with pytest.raises(ImageFileError) as refused:
        confined_state(path, root)
    assert str(refused.value) == str(expected.value)
    assert "outside the image folder" in str(refused.value)


def test_a_missing_file_or_a_path_climbing_out_is_refused_as_before(tree):
    root, _outside = tree
    with pytest.raises(FileNotFoundError):
        confined_state(root / "patient" / "missing.png", root)
    with pytest.raises(ImageFileError, match="outside the image folder"):
        confined_state(root / ".." / "outside" / "instances" / "image.png", root)
    with pytest.raises(ValueError, match="null byte"):  # as os.stat refuses it
        confined_state(root / "patient" / "nul\0.png", root)


@pytest.mark.skipif(sys.platform != "linux", reason="openat2 is a Linux system call")
def test_on_linux_a_file_inside_costs_no_walk_of_its_folders(tree, monkeypatch):
    root, _outside = tree
    expected = file_state(_deep(root))

    def refuse(*_args):
        raise AssertionError("the folders were walked one by one")

    monkeypatch.setattr(image_files, "confined", refuse)
    assert confined_state(_deep(root), root) == expected
