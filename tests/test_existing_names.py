"""Which files exist in a local dataset folder, named or found by a walk: every answer right,
names under a top folder the download lacks answered by one listing, not a stat each, and the
listings and stats of a tree the page cache does not hold made on threads."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from radharmony_pipeline.processing.storage import source_store
from radharmony_pipeline.processing.storage.source_store import (
    LISTED_FOLDER_MIN_NAMES,
    existing_names,
    named_states,
    tree_states,
)


def touch(root: Path, name: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_present_and_missing_names_at_every_depth(tmp_path: Path) -> None:
    present = ["p1/a1/studies/s/series/e/instances/1.png", "p2/x.png", "top.png"]
    for name in present:
        touch(tmp_path, name)
    (tmp_path / "empty_patient").mkdir()
    crowded = [f"many/{index}.png" for index in range(LISTED_FOLDER_MIN_NAMES + 2)]
    for name in crowded[:-1]:  # the last one is missing from a listed folder
        touch(tmp_path, name)
    # Images directly in the folder (ChestX-Det), enough to be answered by its listing.
    at_root = [f"root_{index}.png" for index in range(LISTED_FOLDER_MIN_NAMES + 2)]
    for name in at_root[:-2]:
        touch(tmp_path, name)
    (tmp_path / at_root[-1]).mkdir()  # a folder where an image is named
    missing = [
        "p1/a1/studies/s/series/e/instances/2.png",  # its folder exists
        "p2/y.png",
        "empty_patient/z.png",
        "no_such_patient/a/b.png",
        "top.png/inside.png",  # a file where a folder is named
        "absent.png",
        crowded[-1],
    ]
    named = [*present, *crowded, *at_root, *missing]
    assert existing_names(tmp_path, named) == {*present, *crowded[:-1], *at_root[:-2]}


def test_a_missing_or_non_folder_root_has_no_names(tmp_path: Path) -> None:
    assert existing_names(tmp_path / "not_downloaded", ["a/b.png", "c.png"]) == set()
    touch(tmp_path, "plain_file")
    assert existing_names(tmp_path / "plain_file", ["a.png"]) == set()


def test_names_under_a_missing_top_folder_cost_no_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    touch(tmp_path, "here/one.png")
    asked: list[str] = []
    real_isfile = os.path.isfile

    def counting_isfile(path: str) -> bool:
        asked.append(str(path))
        return real_isfile(path)

    monkeypatch.setattr(source_store.os.path, "isfile", counting_isfile)
    names = [f"gone_{index}/study/image.png" for index in range(1000)] + ["here/one.png"]
    assert existing_names(tmp_path, names) == {"here/one.png"}
    assert asked == [os.path.join(tmp_path, "here/one.png")]


def test_named_states_gives_each_existing_files_size_and_time(tmp_path: Path) -> None:
    touch(tmp_path, "p1/s1/1.png")
    (tmp_path / "p1/s1/1.png").write_bytes(b"12345")
    touch(tmp_path, "top.png")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    names = ["p1/s1/1.png", "top.png", "p1/s1/2.png", "gone/a.png", "top.png/inside.png", "loop"]
    states = named_states(tmp_path, names)
    assert states.keys() == {"p1/s1/1.png", "top.png"}
    stat = os.stat(tmp_path / "p1/s1/1.png")
    assert states["p1/s1/1.png"] == (5, stat.st_mtime_ns)


def slow_on_threads(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> set[int]:
    """`module.name` made to wait as on a disk the page cache does not hold; the threads
    it ran on."""
    threads: set[int] = set()
    real = getattr(module, name)

    def waiting(*args, **kwargs):
        threads.add(threading.get_ident())
        time.sleep(0.0005)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, waiting)
    return threads


def test_names_alone_in_their_folders_are_stated_on_threads_while_the_disk_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ReXGradient's layout: one image per study folder, a stat each.
    names = [f"p{index}/s/{index}.png" for index in range(3000)]
    for name in names[::2]:
        touch(tmp_path, name)
    threads = slow_on_threads(monkeypatch, source_store.os.path, "isfile")
    assert existing_names(tmp_path, names) == set(names[::2])
    assert len(threads) > 2
    monkeypatch.undo()
    threads = slow_on_threads(monkeypatch, source_store.os, "stat")
    assert named_states(tmp_path, names).keys() == set(names[::2])
    assert len(threads) > 2


def walked_states(root: Path, suffixes: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """What `os.walk` and a stat of each file it lists find (a file gone is not there)."""
    states = {}
    for folder, _folders, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path.suffix.lower() in suffixes and path.exists():
                stat = path.stat()
                states[path.relative_to(root).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return states


def test_a_tree_walk_finds_what_os_walk_finds(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for index, name in enumerate(
        [
            "p1/a1/studies/s/series/e/instances/1.png",
            "p1/a1/studies/s/series/e/instances/2.PNG",  # the suffix in any case
            "p1/a2/studies/s/series/e/instances/3.png",
            "p2/4.jpg",
            "p2/notes.txt",
            "top.png",
            "many/.png",  # a hidden file, no suffix
        ]
    ):
        touch(root, name)
        (root / name).write_bytes(b"x" * index)
    (root / "empty_patient/studies").mkdir(parents=True)
    (root / "folder.png").mkdir()  # a folder, not an image
    outside = tmp_path / "elsewhere"
    touch(outside, "kept_out.png")
    (root / "p2/linked_folder").symlink_to(outside)  # not followed, as os.walk does
    (root / "p2/linked.png").symlink_to(root / "top.png")  # a link to a file is a file
    (root / "p2/dangling.png").symlink_to(tmp_path / "gone.png")
    suffixes = (".png", ".jpg")
    found = tree_states(root, suffixes)
    assert found == walked_states(root, suffixes)
    assert set(found) == {
        "p1/a1/studies/s/series/e/instances/1.png",
        "p1/a1/studies/s/series/e/instances/2.PNG",
        "p1/a2/studies/s/series/e/instances/3.png",
        "p2/4.jpg",
        "p2/linked.png",
        "top.png",
    }
    assert found["p1/a1/studies/s/series/e/instances/2.PNG"][0] == 1
    assert tree_states(tmp_path / "not_downloaded", suffixes) == {}


def test_a_deep_tree_is_listed_and_stated_on_threads_while_the_disk_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CheXpert's layout: each study in its own patient and study folders.
    names = [f"patient{index}/study1/view{index}.png" for index in range(3000)]
    for name in names:
        touch(tmp_path, name)
    listed_on = slow_on_threads(monkeypatch, source_store.os, "scandir")
    stated_on = slow_on_threads(monkeypatch, source_store.os, "stat")
    assert tree_states(tmp_path, (".png",)).keys() == set(names)
    assert len(listed_on) > 2
    assert len(stated_on) > 2
