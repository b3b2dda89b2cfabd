"""The steps update_packed_images chooses among, each on its own: `replay` (a journal left
behind), `patch` (a few changed rows written in place), `resume` (a killed build's scratch
array taken over) and `rebuild` (the whole array assembled and published); and the
durability of what they publish on a local file system: the bytes synced before a rename,
the folder after it (an object store's PUT needs neither)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from test_incremental_reruns import (
    SIZE,
    Calls,
    Killed,
    file_states,
    jobs_for,
    killed_before_any_row,
    rewrite_with_other_pixels,
    small_array,
    write_sources,
)
from upath import UPath

from radharmony_pipeline.processing.execution.cluster import LocalPool
from radharmony_pipeline.processing.jobs import image_jobs as image_jobs_module
from radharmony_pipeline.processing.jobs.image_jobs import (
    JobRunner,
    look_up_current_rows,
    patch_in_place,
    rebuild_array,
    replay_journal,
    resume_killed_build,
    update_packed_images,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage import packed_journal, packed_rows
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER, temporary_sibling
from radharmony_pipeline.processing.storage.packed_journal import is_complete, patch_journal
from radharmony_pipeline.processing.storage.store import local_scratch_file

SOURCES = 12
CHANGED = (2, 7)
# Rows a killed build had not written yet (their PNGs neither).
NOT_YET_WRITTEN = (8, 9, 10, 11)
ON_OBJECT_STORAGE = UPath("memory://bucket/output/images/p.npy")


def packed_in(root: Path) -> Path:
    return root / layout.packed_images("p.train")


def build(sources: list[Path], root: Path):
    return update_packed_images(jobs_for(sources, root), packed_in(root), SIZE, LocalPool(1))


@pytest.fixture
def built(tmp_path: Path) -> tuple[list[Path], Path]:
    sources = write_sources(tmp_path / "sources", SOURCES)
    root = tmp_path / "output"
    build(sources, root)
    return sources, root


def refused(*args, **kwargs):
    raise AssertionError("not on object storage")


# --- replay -------------------------------------------------------------------------------


def test_replay_finishes_a_journal_left_behind_once(tmp_path, monkeypatch):
    packed = tmp_path / "images" / "p.npy"
    array = small_array(packed)
    keys = list("abcdef")
    patch = packed_journal.RowPatch(np.array([0, 5]), np.full((2, 4, 4), 7, np.uint8), keys)
    killed_before_any_row(packed, patch, monkeypatch)
    assert not is_complete(packed)

    assert replay_journal(packed) == 2
    assert replay_journal(packed) == 0  # no journal left

    array[[0, 5]] = 7
    np.testing.assert_array_equal(np.load(packed), array)
    assert is_complete(packed) and not patch_journal(packed).exists()


def test_replay_is_nothing_on_object_storage(monkeypatch):
    """An object is never patched in place, so no journal is looked for (not a request)."""
    monkeypatch.setattr(image_jobs_module, "replay_interrupted_patch", refused)
    assert replay_journal(ON_OBJECT_STORAGE) == 0


# --- patch --------------------------------------------------------------------------------


@pytest.mark.build
def test_patch_runs_only_the_stale_rows_and_writes_them_in_place(built, tmp_path, monkeypatch):
    sources, root = built
    packed = packed_in(root)
    inode = packed.stat().st_ino
    for position in CHANGED:
        rewrite_with_other_pixels(sources[position], position)
    jobs = jobs_for(sources, root)
    found = look_up_current_rows(jobs, packed, SIZE, [None] * SOURCES, LocalPool(1))
    assert found is not None and found.stale == list(CHANGED)
    calls = Calls(monkeypatch)

    rows, written = patch_in_place(jobs, found, packed, SIZE, JobRunner(LocalPool(1)))

    assert written == len(CHANGED) and calls.patched == list(CHANGED)
    assert sorted(calls.decoded) == sorted(sources[position].name for position in CHANGED)
    assert [row.decoded for row in rows] == [p in CHANGED for p in range(SOURCES)]
    assert packed.stat().st_ino == inode  # in place, not a copy published over it
    assert is_complete(packed) and not patch_journal(packed).exists()
    fresh = build(sources, tmp_path / "fresh")
    np.testing.assert_array_equal(np.load(packed), np.load(packed_in(tmp_path / "fresh")))
    assert [replace(row, decoded=False) for row in rows] == [
        replace(row, decoded=False) for row in fresh.rows
    ]
    assert layout.packed_keys(packed).read_bytes() == (
        layout.packed_keys(packed_in(tmp_path / "fresh")).read_bytes()
    )


@pytest.mark.build
def test_patch_without_a_stale_row_runs_and_writes_nothing(built, monkeypatch):
    sources, root = built
    packed = packed_in(root)
    jobs = jobs_for(sources, root)
    found = look_up_current_rows(jobs, packed, SIZE, [None] * SOURCES, LocalPool(1))
    assert found is not None and found.stale == []
    before = file_states(root)
    calls = Calls(monkeypatch)

    rows, written = patch_in_place(jobs, found, packed, SIZE, JobRunner(LocalPool(1)))

    assert written == 0 and rows == found.rows
    assert (calls.decoded, calls.written, calls.patched) == ([], [], [])
    assert file_states(root) == before


# --- resume -------------------------------------------------------------------------------


def dead_pid() -> int:
    """The id of a process that has exited."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(finished.stdout)


@dataclass(frozen=True)
class KilledBuild:
    sources: list[Path]
    root: Path
    packed: Path
    jobs: list
    orphan: Path  # the killed build's scratch array
    complete: np.ndarray  # the array it would have published


@pytest.fixture
def killed_build(built) -> KilledBuild:
    """What a build killed before it wrote the rows NOT_YET_WRITTEN leaves: its scratch
    array beside the packed one (named after its dead writer), those rows zero and their
    PNGs unwritten, no published array, key record or header record."""
    sources, root = built
    packed = packed_in(root)
    complete = np.load(packed)
    mine = temporary_sibling(packed)  # named after this (live) process
    orphan = mine.with_name(
        mine.name.replace(f"{TEMP_MARKER}{os.getpid()}@", f"{TEMP_MARKER}{dead_pid()}@")
    )
    left = complete.copy()
    left[list(NOT_YET_WRITTEN)] = 0
    np.save(orphan, left)
    for position in NOT_YET_WRITTEN:
        (root / layout.resized_image("p.train", sources[position].stem)).unlink()
    for path in (packed, layout.packed_keys(packed), layout.packed_headers(packed)):
        path.unlink()
    return KilledBuild(sources, root, packed, jobs_for(sources, root), orphan, complete)


@pytest.mark.build
def test_resume_takes_over_a_killed_builds_scratch_array_with_its_current_rows(
    killed_build, monkeypatch
):
    killed = killed_build
    calls = Calls(monkeypatch)

    with local_scratch_file(killed.packed, suffix=".npy") as scratch:
        held = resume_killed_build(killed.jobs, killed.packed, scratch, SIZE, LocalPool(1))
        assert held is not None
        assert [row is None for row in held] == [p in NOT_YET_WRITTEN for p in range(SOURCES)]
        assert not any(row.decoded for row in held if row is not None)
        assert not killed.orphan.exists()  # renamed: it is this build's scratch array now
        np.testing.assert_array_equal(np.load(scratch)[:8], killed.complete[:8])
    assert (calls.decoded, calls.read, calls.written) == ([], [], [])


def test_resume_without_a_killed_build_takes_over_nothing(tmp_path):
    sources = write_sources(tmp_path / "sources", 2)
    packed = packed_in(tmp_path / "output")
    with local_scratch_file(packed, suffix=".npy") as scratch:
        assert (
            resume_killed_build(jobs_for(sources, tmp_path), packed, scratch, SIZE, LocalPool(1))
            is None
        )
        assert not scratch.exists()


def test_resume_is_nothing_on_object_storage(tmp_path, monkeypatch):
    """An object's array is assembled in this machine's temporary folder: none to take over."""
    monkeypatch.setattr(image_jobs_module, "claim_interrupted_build", refused)
    sources = write_sources(tmp_path / "sources", 2)
    jobs = jobs_for(sources, tmp_path)
    assert (
        resume_killed_build(jobs, ON_OBJECT_STORAGE, tmp_path / "x.npy", SIZE, LocalPool(1)) is None
    )


# --- rebuild ------------------------------------------------------------------------------


@pytest.mark.build
def test_rebuild_assembles_the_array_publishes_it_once_and_records_its_keys(tmp_path):
    sources = write_sources(tmp_path / "sources", 6)
    root = tmp_path / "output"
    packed = packed_in(root)
    jobs = jobs_for(sources, root)

    with local_scratch_file(packed, suffix=".npy") as scratch:
        rows = rebuild_array(jobs, packed, scratch, SIZE, JobRunner(LocalPool(1)))
        assert not scratch.exists()  # renamed into place

    assert all(row.decoded and row.status == "ok" for row in rows)
    array = np.load(packed)
    assert array.shape == (6, SIZE, SIZE) and all(array[p].any() for p in range(6))
    assert json.loads(layout.packed_keys(packed).read_text()) == [row.input_key for row in rows]
    assert is_complete(packed)
    assert not list(packed.parent.glob(f"{TEMP_MARKER}*"))


@pytest.mark.build
def test_rebuild_after_resume_runs_only_the_rows_not_held(killed_build, monkeypatch):
    killed = killed_build
    jobs, packed = killed.jobs, killed.packed
    calls = Calls(monkeypatch)

    with local_scratch_file(packed, suffix=".npy") as scratch:
        held = resume_killed_build(jobs, packed, scratch, SIZE, LocalPool(1))
        rows = rebuild_array(jobs, packed, scratch, SIZE, JobRunner(LocalPool(1)), held)

    assert sorted(calls.decoded) == [killed.sources[p].name for p in NOT_YET_WRITTEN]
    assert [row.decoded for row in rows] == [p in NOT_YET_WRITTEN for p in range(SOURCES)]
    np.testing.assert_array_equal(np.load(packed), killed.complete)
    assert is_complete(packed)


# --- durability ---------------------------------------------------------------------------


class Syncs:
    """Every os.fsync of this process, in order, as ("folder" or "file", path), and the other
    events a test adds, so that their order can be checked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        fsync = os.fsync

        def recorded(descriptor: int) -> None:
            kind = "folder" if stat.S_ISDIR(os.fstat(descriptor).st_mode) else "file"
            self.events.append((kind, os.readlink(f"/proc/self/fd/{descriptor}")))
            fsync(descriptor)

        monkeypatch.setattr(os, "fsync", recorded)

    def note(self, event: str, path: object = "") -> None:
        self.events.append((event, str(path)))

    def in_folder(self, folder: Path) -> Iterator[tuple[str, str]]:
        """The events about `folder` and the files right in it, and the noted ones."""
        folder = folder.resolve()
        for kind, path in self.events:
            synced = kind in ("file", "folder")
            if not synced or Path(path) == folder or Path(path).parent == folder:
                yield kind, path


# A temporary sibling's prefix: `.partial-<pid>@<host>-<random>-`.
TEMPORARY_PREFIX = re.compile(rf"^{re.escape(TEMP_MARKER)}\d+@.*-[0-9a-f]{{32}}-")


def names(events: Iterator[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each event with the file's name (a temporary's without its unique prefix)."""
    named = []
    for kind, path in events:
        name = Path(path).name
        temporary = TEMPORARY_PREFIX.match(name)
        if temporary:
            name = f"(temporary) {name[temporary.end() :]}"
        named.append((kind, name))
    return named


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="names a descriptor's file through /proc"
)


@needs_proc
def test_a_patch_syncs_its_journal_and_its_folder_before_any_row_is_written(tmp_path, monkeypatch):
    packed = tmp_path / "images" / "p.npy"
    small_array(packed)
    syncs = Syncs(monkeypatch)
    write_rows = packed_journal.write_rows

    def noted_write_rows(writer, patch):
        syncs.note("rows written")
        write_rows(writer, patch)

    monkeypatch.setattr(packed_journal, "write_rows", noted_write_rows)
    patch = packed_journal.RowPatch(np.array([1]), np.zeros((1, 4, 4), np.uint8), list("abcdef"))

    packed_journal.patch_rows(packed, patch)

    assert names(syncs.in_folder(packed.parent)) == [
        ("file", "(temporary) p.npy.patch.npz"),  # the journal's bytes, before its rename
        ("folder", "images"),  # its rename
        ("rows written", ""),
        ("file", "p.npy"),  # the rows, before the key record says the array is complete
        ("file", "(temporary) p.npy.keys.json"),
        ("folder", "images"),  # the key record's rename, before the journal is removed
    ]


@needs_proc
def test_a_replay_syncs_the_rows_and_the_key_record_with_its_folder(tmp_path, monkeypatch):
    packed = tmp_path / "images" / "p.npy"
    small_array(packed)
    patch = packed_journal.RowPatch(np.array([1]), np.zeros((1, 4, 4), np.uint8), list("abcdef"))
    killed_before_any_row(packed, patch, monkeypatch)
    syncs = Syncs(monkeypatch)

    assert packed_journal.replay_interrupted_patch(packed) == 1

    assert names(syncs.in_folder(packed.parent)) == [
        ("file", "p.npy"),
        ("file", "(temporary) p.npy.keys.json"),
        ("folder", "images"),
    ]


@needs_proc
@pytest.mark.build
def test_a_rebuild_syncs_the_array_before_its_rename_and_its_folder_after(tmp_path, monkeypatch):
    sources = write_sources(tmp_path / "sources", 4)
    root = tmp_path / "output"
    packed = packed_in(root)
    syncs = Syncs(monkeypatch)
    publish_file = image_jobs_module.publish_file

    def noted_publish_file(path, local_file):
        syncs.note("renamed", path)
        publish_file(path, local_file)

    monkeypatch.setattr(image_jobs_module, "publish_file", noted_publish_file)

    build(sources, root)

    assert names(syncs.in_folder(packed.parent)) == [
        ("file", "(temporary) p.train.npy"),  # the scratch array's rows
        ("renamed", "p.train.npy"),
        ("folder", "images"),
        ("file", "(temporary) p.train.npy.keys.json"),
        ("folder", "images"),
    ]


def test_the_folder_is_synced_through_a_descriptor_closed_after(tmp_path, monkeypatch):
    synced: list[int] = []

    def recorded(descriptor: int) -> None:
        assert stat.S_ISDIR(os.fstat(descriptor).st_mode)
        synced.append(descriptor)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", recorded)
    with pytest.raises(OSError, match="Input/output"):
        packed_rows.sync_folder(tmp_path / "x.npy")
    [descriptor] = synced
    with pytest.raises(OSError):
        os.fstat(descriptor)  # closed although the sync failed


def test_nothing_is_synced_on_object_storage(monkeypatch):
    """A PUT is atomic and durable once answered: no folder to sync, nothing local."""
    monkeypatch.setattr(os, "fsync", refused)
    packed_rows.sync_folder(ON_OBJECT_STORAGE)
    packed_journal.write_keys(ON_OBJECT_STORAGE, ["a", None])
    assert layout.packed_keys(ON_OBJECT_STORAGE).read_text() == '["a", null]'


def test_a_journal_killed_before_its_rename_leaves_no_journal(tmp_path, monkeypatch):
    """The journal's bytes are synced under a temporary name: a kill (or a power cut) before
    the rename leaves the old, complete array and no journal."""
    packed = tmp_path / "images" / "p.npy"
    small_array(packed)

    def killed(path, content):
        raise Killed

    monkeypatch.setattr(packed_rows, "_write_synced", killed)
    patch = packed_journal.RowPatch(np.array([1]), np.zeros((1, 4, 4), np.uint8), list("abcdef"))
    with pytest.raises(Killed):
        packed_journal.patch_rows(packed, patch)
    assert is_complete(packed) and not patch_journal(packed).exists()
    assert not list(packed.parent.glob(f"{TEMP_MARKER}*"))
