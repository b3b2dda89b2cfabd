"""Which named files exist in a local dataset folder: every answer right, names under a top
folder the download lacks answered by one listing, not a stat each, and the stats of a tree
the page cache does not hold made on threads."""

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

    def waiting(path: str):
        threads.add(threading.get_ident())
        time.sleep(0.0005)
        return real(path)

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
