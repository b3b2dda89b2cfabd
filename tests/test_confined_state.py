"""confined_source: a source's state once its path is known to stay inside the image folder,
the same as confining it and then asking the file, with one lookup where the kernel can; and
its bytes read from that same file, however its path changes meanwhile; a name that ends at
anything but a regular file refused before it is opened."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from deadline import within

from radharmony_pipeline.processing.imaging import image_files
from radharmony_pipeline.processing.imaging.image_files import (
    HeldSource,
    ImageFileError,
    NamedSource,
    confined,
    confined_source,
    header_image_size,
)
from radharmony_pipeline.processing.storage.source_store import (
    NotARegularFile,
    file_state,
    read_source_bytes,
    require_regular_file,
)


def confined_state(path: Path, root: Path):
    """The state confined_source gives for `path` (what an image's input key is made of)."""
    with confined_source(path, root) as source:
        return source.state


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="openat2 is a Linux system call")


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


@linux_only
def test_on_linux_a_file_inside_costs_no_walk_of_its_folders(tree, monkeypatch):
    root, _outside = tree
    expected = file_state(_deep(root))

    def refuse(*_args):
        raise AssertionError("the folders were walked one by one")

    monkeypatch.setattr(image_files, "confined", refuse)
    assert confined_state(_deep(root), root) == expected


def _swap_for_a_link_outside(path: Path, outside: Path) -> None:
    """Replace the file at `path` by a symlink to the file outside (the original moved away)."""
    path.rename(path.with_name("moved.png"))
    path.symlink_to(outside / "instances" / "image.png")


@linux_only
def test_a_held_source_reads_the_file_whose_state_it_took_without_resolving_its_path_again(
    tree, monkeypatch
):
    root, outside = tree
    path = _deep(root)
    with confined_source(path, root) as source:
        assert isinstance(source, HeldSource)
        assert source.state == file_state(path)
        _swap_for_a_link_outside(path, outside)

        def refuse(*_args):
            raise AssertionError("the path was resolved again")

        monkeypatch.setattr(image_files, "confined", refuse)
        assert source.read() == b"inside" * 10
    monkeypatch.undo()
    # A new look at the path sees the link, and refuses it.
    with pytest.raises(ImageFileError, match="outside the image folder"):
        confined_state(path, root)


@linux_only
def test_without_proc_a_held_source_is_read_by_its_path_confined_again(tree, monkeypatch):
    root, outside = tree
    path = _deep(root)
    real_open = os.open

    def no_proc(name, *args, **kwargs):
        if str(name).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", name)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(image_files.os, "open", no_proc)
    with confined_source(path, root) as source:
        assert source.read() == b"inside" * 10
        _swap_for_a_link_outside(path, outside)
        with pytest.raises(ImageFileError, match="outside the image folder"):
            source.read()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_special_file_inside_has_a_state_but_is_never_opened(tree, kind):
    root, _outside = tree
    path = _deep(root).with_name(f"special.{kind}.png")
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with within(10, "reading a FIFO"), confined_source(path, root) as source:
        assert source.state[0] == os.stat(path).st_size
        with pytest.raises(NotARegularFile, match="not a regular file"):
            source.read()


def test_a_state_from_a_listing_is_taken_as_given_after_confining_the_path(tree, monkeypatch):
    root, outside = tree
    asked = []
    monkeypatch.setattr(image_files, "file_state", lambda path: asked.append(path))
    with confined_source(_deep(root), root, (60, 7)) as source:
        assert isinstance(source, NamedSource) and source.state == (60, 7)
        assert source.read() == b"inside" * 10
    assert asked == []
    (root / "linked").symlink_to(outside)
    escaping = confined_source(root / "linked" / "instances" / "image.png", root, (7, 7))
    with pytest.raises(ImageFileError, match="outside the image folder"):
        escaping.__enter__()


def test_the_check_refuses_each_kind_before_opening(tmp_path):
    regular = tmp_path / "image.png"
    regular.write_bytes(b"x")
    require_regular_file(regular)
    assert read_source_bytes(regular) == b"x"
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    link = tmp_path / "link.png"
    link.symlink_to(fifo)  # followed: what matters is what the name ends at
    for path in (fifo, link):
        with pytest.raises(NotARegularFile, match=r"named pipe \(FIFO\)"):
            read_source_bytes(path)
        with pytest.raises(ImageFileError, match="not a regular file; it was not opened"):
            header_image_size(path)
    with pytest.raises(FileNotFoundError):
        require_regular_file(tmp_path / "missing.png")
    with pytest.raises(FileNotFoundError):
        require_regular_file(regular / "below-a-file.png")
