"""Re-runs redo only what changed: an unchanged partition decodes, hashes and rewrites
nothing; a few changed sources are decoded alone and patched into the packed array in place
under a journal; an interrupted patch is replayed, never read as complete; an interrupted
first build resumes from the PNGs it wrote. Counts, not times, are asserted."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from radharmony_pipeline.processing.execution.cluster import LocalPool
from radharmony_pipeline.processing.imaging import tagged_png
from radharmony_pipeline.processing.jobs import image_jobs as image_jobs_module
from radharmony_pipeline.processing.jobs.image_jobs import ImageJob, update_packed_images
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage import packed_journal
from radharmony_pipeline.processing.storage.packed_journal import is_complete, patch_journal

SIZE = 32
PARTITION = "p.train"
SOURCES = 200
CHANGED = (17, 101, 180)


def write_source(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    height, width = rng.integers(40, 72, 2)
    pixels = cv2.GaussianBlur(rng.integers(0, 256, (height, width), dtype=np.uint8), (5, 5), 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), pixels)


def write_sources(folder: Path, count: int) -> list[Path]:
    paths = [folder / f"image{index:04d}.png" for index in range(count)]
    for index, path in enumerate(paths):
        write_source(path, index)
    return paths


def rewrite_with_other_pixels(path: Path, seed: int) -> None:
    """New content, and a modification time that differs even on a coarse clock."""
    before = path.stat().st_mtime_ns
    write_source(path, 10_000 + seed)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


def jobs_for(sources: Sequence[Path], root: Path) -> list[ImageJob]:
    return [
        ImageJob(
            image_id=f"p/{source.stem}",
            source_file=source,
            union_mask_file=None,
            output_root=root,
            image_relative=layout.resized_image(PARTITION, source.stem),
            mask_relative=None,
            size=SIZE,
            resize="letterbox",
            row=row,
            source_root=source.parent,
        )
        for row, source in enumerate(sources)
    ]


class Calls:
    """What the stage did in this process (one worker runs the jobs here): sources decoded
    and read whole (to hash them), PNGs written, packed rows patched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.decoded: list[str] = []
        self.read: list[str] = []
        self.written: list[str] = []
        self.patched: list[int] = []
        decode, read, write = (
            image_jobs_module.decode_grayscale,
            image_jobs_module.read_source,
            image_jobs_module.publish_tagged_png,
        )
        patch = packed_journal.patch_rows

        def counted_decode(path, **kwargs):
            self.decoded.append(Path(path).name)
            return decode(path, **kwargs)

        def counted_read(source):
            self.read.append(Path(source.path).name)
            return read(source)

        def counted_write(path, *args):
            self.written.append(Path(path).name)
            return write(path, *args)

        def counted_patch(packed, row_patch):
            self.patched.extend(row_patch.rows.tolist())
            return patch(packed, row_patch)

        monkeypatch.setattr(image_jobs_module, "decode_grayscale", counted_decode)
        monkeypatch.setattr(image_jobs_module, "read_source", counted_read)
        monkeypatch.setattr(image_jobs_module, "publish_tagged_png", counted_write)
        monkeypatch.setattr(image_jobs_module, "patch_rows", counted_patch)


def build(sources: Sequence[Path], root: Path):
    packed = root / layout.packed_images(PARTITION)
    return update_packed_images(jobs_for(sources, root), packed, SIZE, LocalPool(1))


def packed_of(root: Path) -> np.ndarray:
    return np.load(root / layout.packed_images(PARTITION))


def file_states(root: Path) -> dict[str, tuple[int, int]]:
    """Every output file's (inode, modification time): a rewrite changes one of them."""
    return {
        str(path.relative_to(root)): (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in root.rglob("*")
        if path.is_file()
    }


@pytest.fixture
def built(tmp_path: Path) -> tuple[list[Path], Path]:
    sources = write_sources(tmp_path / "sources", SOURCES)
    root = tmp_path / "output"
    first = build(sources, root)
    assert first.rows_written == SOURCES
    assert all(row.decoded and row.status == "ok" for row in first.rows)
    return sources, root


class HeaderReads:
    """The output PNGs read in this process: whole, and their first few KB (the tags)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.whole: list[object] = []
        self.heads: list[tuple[str, int]] = []
        read_head = tagged_png.read_head
        monkeypatch.setattr(tagged_png, "read_bytes", self.whole.append)
        monkeypatch.setattr(image_jobs_module, "read_bytes", self.whole.append)

        def counted_head(path, size):
            self.heads.append((Path(path).name, size))
            return read_head(path, size)

        monkeypatch.setattr(tagged_png, "read_head", counted_head)


def table_rows(update) -> list[dict]:
    return [{**vars(row), "decoded": None} for row in update.rows]


@pytest.mark.build
def test_an_unchanged_rerun_decodes_hashes_and_rewrites_nothing(built, monkeypatch):
    sources, root = built
    first = build(sources, root)  # the same rows as the first build's, from its record
    before = file_states(root)
    calls = Calls(monkeypatch)
    reads = HeaderReads(monkeypatch)

    again = build(sources, root)

    assert (calls.decoded, calls.read, calls.written, calls.patched) == ([], [], [], [])
    # The outputs are in the state the header record holds: a stat each, not even a header.
    assert reads.whole == [] and reads.heads == []
    assert again.rows_written == 0 and again.rows_replayed == 0
    assert not any(row.decoded for row in again.rows)
    assert table_rows(again) == table_rows(first)
    assert file_states(root) == before  # the record itself is not written again


@pytest.mark.build
def test_without_a_header_record_each_header_is_read_once_and_recorded(built, monkeypatch):
    sources, root = built
    packed = root / layout.packed_images(PARTITION)
    first = build(sources, root)
    layout.packed_headers(packed).unlink()
    calls = Calls(monkeypatch)
    reads = HeaderReads(monkeypatch)

    recorded = build(sources, root)
    heads_then = list(reads.heads)
    again = build(sources, root)

    assert (calls.decoded, calls.written, calls.patched) == ([], [], [])
    # Each output PNG is only opened for the first few KB that hold its tags, once.
    assert reads.whole == [] and len(heads_then) == SOURCES
    assert max(size for _name, size in heads_then) <= 4096
    assert reads.heads == heads_then  # the second re-run read none: the record is back
    assert table_rows(recorded) == table_rows(again) == table_rows(first)


@pytest.mark.build
@pytest.mark.parametrize("damage", ["unreadable", "other_rows", "empty"])
def test_a_damaged_or_foreign_header_record_falls_back_to_the_headers(
    built, damage, tmp_path, monkeypatch
):
    sources, root = built
    record = layout.packed_headers(root / layout.packed_images(PARTITION))
    first = build(sources, root)
    if damage == "unreadable":
        record.write_bytes(b"PAR1 not a parquet file")
    elif damage == "other_rows":  # another partition's record, of fewer rows
        other = tmp_path / "other"
        update_packed_images(jobs_for(sources[:5], other), other / "x.npy", SIZE, LocalPool(1))
        record.write_bytes(layout.packed_headers(other / "x.npy").read_bytes())
    else:
        record.write_bytes(b"")
    calls = Calls(monkeypatch)
    reads = HeaderReads(monkeypatch)

    again = build(sources, root)

    assert (calls.decoded, calls.written) == ([], [])
    assert len(reads.heads) == SOURCES
    assert table_rows(again) == table_rows(first)


@pytest.mark.build
def test_an_output_not_in_its_recorded_state_is_read_from_its_header(built, monkeypatch):
    """A PNG written over (here: its tags say another source height, with the current key)
    or only touched is looked at again; the record is never trusted over the file."""
    sources, root = built
    first = build(sources, root)
    edited, touched = (root / first.rows[position].image_path for position in (7, 8))
    tags = tagged_png.read_png_tags(edited)
    key = tags.pop(tagged_png.INPUT_KEY_TAG)
    pixels = cv2.imread(str(edited), cv2.IMREAD_UNCHANGED)
    edited_tags = {tagged_png.INPUT_KEY_TAG: key, **tags, "orig_height": "999"}
    edited.write_bytes(tagged_png.with_text_tags(tagged_png.radiograph_png(pixels), edited_tags))
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    calls = Calls(monkeypatch)
    reads = HeaderReads(monkeypatch)

    again = build(sources, root)

    assert (calls.decoded, calls.written) == ([], [])
    assert sorted(name for name, _size in reads.heads) == sorted([edited.name, touched.name])
    assert again.rows[7].orig_height == 999
    expected = table_rows(first)
    expected[7]["orig_height"] = 999
    assert table_rows(again) == expected
    reads.heads.clear()
    build(sources, root)
    assert reads.heads == []  # both recorded in their new states


@pytest.mark.build
def test_a_few_changed_sources_are_decoded_alone_and_patched_in_place(built, tmp_path, monkeypatch):
    sources, root = built
    packed_file = root / layout.packed_images(PARTITION)
    inode = packed_file.stat().st_ino
    for position in CHANGED:
        rewrite_with_other_pixels(sources[position], position)
    calls = Calls(monkeypatch)

    patched = build(sources, root)

    changed_names = sorted(sources[position].name for position in CHANGED)
    assert sorted(calls.decoded) == changed_names
    assert sorted(calls.read) == changed_names
    assert sorted(calls.written) == sorted(
        Path(layout.resized_image(PARTITION, sources[p].stem)).name for p in CHANGED
    )
    assert calls.patched == list(CHANGED) and patched.rows_written == len(CHANGED)
    assert [row.decoded for row in patched.rows].count(True) == len(CHANGED)
    # Patched in place: the same file, never a copy published over it.
    assert packed_file.stat().st_ino == inode
    assert is_complete(packed_file) and not patch_journal(packed_file).exists()

    fresh = build(sources, tmp_path / "fresh")
    np.testing.assert_array_equal(packed_of(root), packed_of(tmp_path / "fresh"))
    assert [row.source_sha256 for row in patched.rows] == [row.source_sha256 for row in fresh.rows]
    assert (root / layout.packed_keys(Path(layout.packed_images(PARTITION)))).read_bytes() == (
        tmp_path / "fresh" / layout.packed_keys(Path(layout.packed_images(PARTITION)))
    ).read_bytes()


class Killed(Exception):
    """Stands for the process being killed at that point."""


# --- the journal on its own (fast) ---------------------------------------------------------


def small_array(path: Path, rows: int = 6) -> np.ndarray:
    array = np.arange(rows * 4 * 4, dtype=np.uint8).reshape(rows, 4, 4)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)
    packed_journal.write_keys(path, [f"k{row}" for row in range(rows)])
    return array


def test_a_patch_writes_its_rows_in_place_and_records_the_new_keys(tmp_path):
    packed = tmp_path / "images" / "p.npy"
    array = small_array(packed)
    inode = packed.stat().st_ino
    pixels = np.full((2, 4, 4), 200, np.uint8)
    keys = ["k0", "new1", "k2", "k3", "new4", "k5"]

    packed_journal.patch_rows(packed, packed_journal.RowPatch(np.array([1, 4]), pixels, keys))

    expected = array.copy()
    expected[[1, 4]] = 200
    np.testing.assert_array_equal(np.load(packed), expected)
    assert packed.stat().st_ino == inode and is_complete(packed)
    assert layout.packed_keys(packed).read_text() == json.dumps(keys)


def killed_before_any_row(packed: Path, patch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch `packed`, the process killed right after the journal is published and the key
    record withdrawn, before any row is written."""

    def killed(*args):
        raise Killed

    with monkeypatch.context() as crash:
        crash.setattr(packed_journal, "write_rows", killed)
        with pytest.raises(Killed):
            packed_journal.patch_rows(packed, patch)


def test_a_journal_left_behind_is_replayed_and_the_array_is_incomplete_until_then(
    tmp_path, monkeypatch
):
    packed = tmp_path / "images" / "p.npy"
    array = small_array(packed)
    patch = packed_journal.RowPatch(
        np.array([0, 5]), np.full((2, 4, 4), 7, np.uint8), list("abcdef")
    )
    killed_before_any_row(packed, patch, monkeypatch)
    assert not is_complete(packed) and not layout.packed_keys(packed).exists()

    assert packed_journal.replay_interrupted_patch(packed) == 2
    assert packed_journal.replay_interrupted_patch(packed) == 0  # done once, then gone
    array[[0, 5]] = 7
    np.testing.assert_array_equal(np.load(packed), array)
    assert is_complete(packed)
    assert json.loads(layout.packed_keys(packed).read_text()) == list("abcdef")


def test_a_patch_that_does_not_fit_the_array_is_refused_with_the_fix(tmp_path):
    packed = tmp_path / "images" / "p.npy"
    small_array(packed)
    outside = packed_journal.RowPatch(np.array([9]), np.zeros((1, 4, 4), np.uint8), ["x"] * 6)
    with pytest.raises(ValueError, match=r"does not fit.*remove"):
        packed_journal.patch_rows(packed, outside)


def test_a_journal_whose_array_is_gone_is_dropped(tmp_path, monkeypatch):
    packed = tmp_path / "images" / "p.npy"
    small_array(packed)
    patch = packed_journal.RowPatch(np.array([1]), np.zeros((1, 4, 4), np.uint8), ["x"] * 6)
    killed_before_any_row(packed, patch, monkeypatch)
    packed.unlink()
    assert packed_journal.replay_interrupted_patch(packed) == 0
    assert not patch_journal(packed).exists()


def test_a_journal_beside_a_truncated_array_is_dropped_with_the_key_record(tmp_path, monkeypatch):
    packed = tmp_path / "images" / "p.npy"
    small_array(packed)
    patch = packed_journal.RowPatch(np.array([1]), np.zeros((1, 4, 4), np.uint8), ["x"] * 6)
    killed_before_any_row(packed, patch, monkeypatch)
    packed_journal.write_keys(packed, ["k"] * 6)  # as if the record had come back
    packed.write_bytes(packed.read_bytes()[:-20])  # the last row cut short
    assert packed_journal.replay_interrupted_patch(packed) == 0
    assert not patch_journal(packed).exists() and not layout.packed_keys(packed).exists()
    assert not is_complete(packed)


def changed_then_killed(built, monkeypatch, step: str, killed) -> tuple[Path, np.ndarray]:
    """Other pixels in the CHANGED sources, then a build that `killed`, standing in for
    `packed_journal.<step>`, stops: (the packed array's path, the array before the change)."""
    sources, root = built
    old = packed_of(root)
    for position in CHANGED:
        rewrite_with_other_pixels(sources[position], position)
    with monkeypatch.context() as crash:
        crash.setattr(packed_journal, step, killed)
        with pytest.raises(Killed):
            build(sources, root)
    return root / layout.packed_images(PARTITION), old


@pytest.mark.build
def test_a_patch_interrupted_halfway_is_never_complete_and_is_replayed(
    built, tmp_path, monkeypatch
):
    sources, root = built
    write_rows = packed_journal.write_rows

    def killed_after_one_row(writer, patch):
        first = packed_journal.RowPatch(patch.rows[:1], patch.pixels[:1], patch.keys)
        write_rows(writer, first)
        raise Killed

    packed_file, old = changed_then_killed(built, monkeypatch, "write_rows", killed_after_one_row)
    half = packed_of(root)
    assert not np.array_equal(half[CHANGED[0]], old[CHANGED[0]])
    np.testing.assert_array_equal(half[CHANGED[1]], old[CHANGED[1]])
    # What a reader sees: no key record, a journal: not a finished array.
    assert not is_complete(packed_file)
    assert not layout.packed_keys(packed_file).exists() and patch_journal(packed_file).exists()

    calls = Calls(monkeypatch)
    resumed = build(sources, root)

    assert resumed.rows_replayed == len(CHANGED) and resumed.rows_written == 0
    assert (calls.decoded, calls.written, calls.patched) == ([], [], [])
    assert is_complete(packed_file) and not patch_journal(packed_file).exists()
    fresh = build(sources, tmp_path / "fresh")
    np.testing.assert_array_equal(packed_of(root), packed_of(tmp_path / "fresh"))
    assert resumed.rows == [replace(row, decoded=False) for row in fresh.rows]


@pytest.mark.build
def test_a_patch_killed_before_its_journal_leaves_the_old_array_complete(
    built, tmp_path, monkeypatch
):
    sources, root = built

    def killed(handle, patch):
        raise Killed

    packed_file, old = changed_then_killed(built, monkeypatch, "_write_journal", killed)
    assert is_complete(packed_file)
    np.testing.assert_array_equal(packed_of(root), old)
    calls = Calls(monkeypatch)
    again = build(sources, root)
    # The changed images' PNGs were written before the kill: re-used, not decoded again.
    assert calls.decoded == [] and calls.patched == list(CHANGED)
    assert again.rows_written == len(CHANGED)
    build(sources, tmp_path / "fresh")
    np.testing.assert_array_equal(packed_of(root), packed_of(tmp_path / "fresh"))


@pytest.mark.build
def test_an_interrupted_first_build_decodes_only_the_images_not_yet_written(tmp_path, monkeypatch):
    sources = write_sources(tmp_path / "sources", 60)
    root = tmp_path / "output"
    decode = image_jobs_module.decode_grayscale
    done = Counter()

    def killed_at_the_41st(path, **kwargs):
        done["images"] += 1
        if done["images"] == 41:
            raise Killed
        return decode(path, **kwargs)

    with monkeypatch.context() as crash:
        crash.setattr(image_jobs_module, "decode_grayscale", killed_at_the_41st)
        with pytest.raises(Killed):
            build(sources, root)
    assert not (root / layout.packed_images(PARTITION)).exists()

    calls = Calls(monkeypatch)
    resumed = build(sources, root)

    assert sorted(calls.decoded) == [source.name for source in sources[40:]]
    assert resumed.rows_written == len(sources)
    build(sources, tmp_path / "fresh")
    np.testing.assert_array_equal(packed_of(root), packed_of(tmp_path / "fresh"))


@pytest.mark.build
def test_a_first_build_keys_each_source_once_and_records_the_keys_its_pngs_carry(
    tmp_path, monkeypatch
):
    sources = write_sources(tmp_path / "sources", 30)
    sources[7].write_bytes(b"not an image")  # an error row keeps the key it was run with
    stated = Counter()
    source = image_jobs_module.confined_source

    def counted_source(path, root, state=None):
        stated[Path(path).name] += 1
        return source(path, root, state)

    monkeypatch.setattr(image_jobs_module, "confined_source", counted_source)
    root = tmp_path / "output"
    first = build(sources, root)

    # Each job's own stat, before it reads its source: nothing beforehand in the step.
    assert stated == Counter(source.name for source in sources)
    packed = root / layout.packed_images(PARTITION)
    recorded = json.loads(layout.packed_keys(packed).read_text())
    good = [(row, key) for row, key in zip(first.rows, recorded, strict=True) if row.image_path]
    assert [key for _row, key in good] == [
        tagged_png.stored_input_key(root / row.image_path) for row, _key in good
    ]
    assert len(good) == len(sources) - 1 and first.rows[7].status == "error"
    assert recorded[7] == first.rows[7].input_key is not None

    stated.clear()
    calls = Calls(monkeypatch)
    again = build(sources, root)
    assert calls.written == [] and calls.decoded == [sources[7].name]  # only the error row
    assert stated == Counter(source.name for source in sources) + Counter([sources[7].name])
    assert [row.input_key for row in again.rows] == recorded


# --- the stages through Dagster ------------------------------------------------------------


# The stages that re-use their last tables when what they read is unchanged.
REUSING_STAGES = ("raw_index", "labels", "bboxes", "masks", "partition_profile")


def materialization_metadata(result, asset: str) -> dict[str, object]:
    for event in result.get_asset_materialization_events():
        if event.materialization.asset_key.to_user_string() == asset:
            return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    raise AssertionError(f"{asset} was not materialized")


@pytest.mark.build
def test_an_unchanged_partition_reuses_every_stage_and_a_changed_image_is_patched(
    tiny_copy, tmp_path, monkeypatch
):
    import dagster as dg

    from radharmony_pipeline.definitions import build_definitions
    from radharmony_pipeline.defs.assets import profile as profile_asset
    from radharmony_pipeline.processing.corpus.profile_plots import profile_pngs
    from radharmony_pipeline.sources.rexgradient import ReXGradientSource

    partition = "rexgradient.train"
    monkeypatch.setenv("RADHARMONY_WORKERS", "1")
    output = tmp_path / "output"
    job = build_definitions(tiny_copy, output).resolve_job_def("all_stages")
    instance = dg.DagsterInstance.ephemeral()
    first = job.execute_in_process(partition_key=partition, instance=instance)
    tables = {
        asset: pd.read_parquet(layout.table_file(output, asset, partition))
        for asset in ("raw_index", "labels", "bboxes", "masks")
    }
    index = tables["raw_index"]
    for asset in REUSING_STAGES:
        assert materialization_metadata(first, asset)["reused"] is False
    written = table_file_states(output, partition)
    tree_after_first = tree_states(output)

    reads = Counter()
    read_split, read_boxes = ReXGradientSource.read_split, ReXGradientSource.read_boxes

    def counted_read_split(self, split):
        reads["metadata"] += 1
        return read_split(self, split)

    def counted_read_boxes(self, split):
        reads["boxes"] += 1
        return read_boxes(self, split)

    def counted_profile(*args, **kwargs):
        reads["profile drawn"] += 1
        return profile_pngs(*args, **kwargs)

    monkeypatch.setattr(ReXGradientSource, "read_split", counted_read_split)
    monkeypatch.setattr(ReXGradientSource, "read_boxes", counted_read_boxes)
    monkeypatch.setattr(profile_asset, "profile_pngs", counted_profile)
    again = job.execute_in_process(partition_key=partition, instance=instance)

    assert reads == Counter()
    for asset in REUSING_STAGES:
        assert materialization_metadata(again, asset)["reused"] is True
    # No table file written again, the profile's PNG neither: no file or folder at all.
    assert table_file_states(output, partition) == written
    assert tree_states(output) == tree_after_first
    images = materialization_metadata(again, "images")
    assert (images["decoded"], images["packed_rows_written"]) == (0, 0)
    assert images["reused"] == len(index)
    for asset, table in tables.items():
        pd.testing.assert_frame_equal(
            pd.read_parquet(layout.table_file(output, asset, partition)), table
        )

    changed = tiny_copy / "rexgradient" / "deid_png" / index["image_path"].iloc[1]
    pixels = cv2.imread(str(changed), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(changed), np.ascontiguousarray(pixels[::-1]))
    third = job.execute_in_process(partition_key=partition, instance=instance)

    # The metadata files did not change; the images table did, so the profile is drawn again.
    assert reads == Counter({"profile drawn": 1})
    images = materialization_metadata(third, "images")
    assert (images["decoded"], images["packed_rows_written"]) == (1, 1)
    for asset in ("raw_index", "labels", "bboxes", "masks"):
        assert materialization_metadata(third, asset)["reused"] is True
    assert materialization_metadata(third, "partition_profile")["reused"] is False
    now = table_file_states(output, partition)
    assert {name for name, state in now.items() if state != written[name]} == {
        "images",
        "partition_profile.png",
    }


def tree_states(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `root`: (inode, modification time)."""
    return {
        str(path.relative_to(root)): (path.stat().st_ino, path.stat().st_mtime_ns)
        for path in [root, *root.rglob("*")]
    }


def table_file_states(output: Path, partition: str) -> dict[str, tuple[int, int]]:
    """Each table file of the partition and its profile PNG: (inode, modification time)."""
    from radharmony_pipeline.defs.assets.profile import PARTITION_PROFILE_INPUTS

    tables = (*PARTITION_PROFILE_INPUTS, "partition_profile")  # every table of a partition
    files = {asset: layout.table_file(output, asset, partition) for asset in tables}
    files["partition_profile.png"] = output / layout.preview("profile", partition)
    return {name: (path.stat().st_ino, path.stat().st_mtime_ns) for name, path in files.items()}


@pytest.mark.build
@pytest.mark.slow
def test_a_run_killed_mid_images_then_decodes_only_the_images_not_yet_written(
    tiny_copy, tmp_path, monkeypatch
):
    """SIGKILL while the `images` step decodes the middle image (a very large one), then
    the same job again: every image whose PNG was written is re-used, the others decoded."""
    import signal
    import subprocess
    import sys
    import time

    import dagster as dg
    from PIL import Image

    from radharmony_pipeline.definitions import build_definitions
    from radharmony_pipeline.sources import SourceLocation, open_source

    partition, split = "rexgradient.train", "train"
    source = open_source("rexgradient", SourceLocation(), {"RADHARMONY_DATA_ROOT": str(tiny_copy)})
    index = source.read_split(split).index
    index = index[index["status"] == "ok"].reset_index(drop=True)
    middle = len(index) // 2
    noise = np.random.default_rng(0).integers(0, 65535, (9000, 9000), dtype=np.uint16)
    Image.fromarray(noise).save(source.image_dir(split) / index["image_path"][middle])
    script = tmp_path / "materialize.py"
    script.write_text(
        "import sys\n"
        "from radharmony_pipeline.definitions import build_definitions\n"
        "if __name__ == '__main__':\n"
        "    job = build_definitions(sys.argv[1], sys.argv[2]).resolve_job_def('all_stages')\n"
        "    result = job.execute_in_process(partition_key=sys.argv[3], raise_on_error=False)\n"
        "    sys.exit(0 if result.success else 1)\n"
    )
    output = tmp_path / "output"
    process = subprocess.Popen(
        [sys.executable, str(script), str(tiny_copy), str(output), partition],
        env={**os.environ, "RADHARMONY_WORKERS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Its own process group, so that the kill takes its pool's worker too: an orphaned
        # worker would otherwise finish the image in hand after the PNGs are counted.
        start_new_session=True,
    )
    pngs = [output / layout.resized_image(partition, key) for key in index["image_key"]]
    # A bound against a hang, not a timing: the stages before `images` come first, and a
    # loaded machine takes minutes over them.
    deadline = time.monotonic() + 900
    while not pngs[middle - 1].exists() and process.poll() is None:
        assert time.monotonic() < deadline, "the images step never reached the middle image"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    written = {png.name for png in pngs if png.exists()}
    assert 0 < len(written) < len(pngs), "the run must be killed mid-way"

    monkeypatch.setenv("RADHARMONY_WORKERS", "1")
    job = build_definitions(tiny_copy, output).resolve_job_def("all_stages")
    resumed = job.execute_in_process(
        partition_key=partition, instance=dg.DagsterInstance.ephemeral()
    )

    images = materialization_metadata(resumed, "images")
    table = pd.read_parquet(layout.table_file(output, "images", partition))
    decodable = table[table["status"] == "ok"]["image_path"].map(lambda path: Path(path).name)
    # Every image decodable and not yet written is decoded (an unreadable one fails again).
    assert images["decoded"] == len(set(decodable) - written) > 0
    assert images["reused"] == len(written)
    assert images["packed_rows_written"] == images["images"]  # assembled: no array yet


def test_a_stage_fingerprint_follows_the_files_of_the_tables_it_is_given(tiny_copy, tmp_path):
    from radharmony_pipeline.defs.previous_outputs import stage_fingerprint
    from radharmony_pipeline.defs.resources import DatasetsResource

    source = DatasetsResource(data_root=str(tiny_copy)).source("rexgradient")
    table = layout.table_file(tmp_path, "raw_index", "rexgradient.train")
    table.parent.mkdir(parents=True)
    table.write_bytes(b"first table")

    def fingerprint() -> str | None:
        return stage_fingerprint("1", "rexgradient.train", source, "train", [table])

    first = fingerprint()
    assert first is not None and fingerprint() == first
    assert stage_fingerprint("2", "rexgradient.train", source, "train", [table]) != first
    table.write_bytes(b"other table")  # same size, other bytes, a later modification time
    second = fingerprint()
    assert second != first
    table.unlink()
    assert fingerprint() not in (first, second)
    table.write_bytes(b"other table")
    os.utime(table, ns=(1, 1))
    assert fingerprint() != second  # the same bytes, written again at another time


def test_a_profile_without_its_tables_names_the_stage_to_materialize(tiny_copy, tmp_path):
    import dagster as dg

    from radharmony_pipeline.definitions import build_definitions

    job = build_definitions(tiny_copy, tmp_path / "output").resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        partition_key="rexgradient.train",
        asset_selection=[dg.AssetKey("partition_profile")],
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )

    assert not result.success
    [failure] = [event for event in result.all_events if event.is_step_failure]
    message = failure.step_failure_data.error.message
    assert "`raw_index` of this partition is not materialized" in message
    assert "Fix: materialize `raw_index` for rexgradient.train" in message


@pytest.mark.build
@pytest.mark.parametrize("partition", ["chestx_det.train", "chexlocalize.val", "ms_cxr.train"])
def test_a_rerun_validates_no_suite_the_build_before_it_validated(
    tiny_copy, tmp_path, monkeypatch, partition
):
    """The tables re-used from their files (other dtypes than the ones computed) are the
    tables the suites saw: their kept reports are given back."""
    import dagster as dg

    from radharmony_pipeline.definitions import build_definitions
    from radharmony_pipeline.processing.tables import suite_validation

    validated = []
    submit = suite_validation.InProcessValidation.submit

    def counted_submit(self, frame, suite, *arguments):
        validated.append(suite)
        return submit(self, frame, suite, *arguments)

    monkeypatch.setenv("RADHARMONY_WORKERS", "1")
    monkeypatch.setattr(suite_validation.InProcessValidation, "submit", counted_submit)
    job = build_definitions(tiny_copy, tmp_path / "output").resolve_job_def("all_stages")
    instance = dg.DagsterInstance.ephemeral()
    job.execute_in_process(partition_key=partition, instance=instance)
    assert sorted(validated) == ["bboxes", "labels", "masks", "raw_index"]
    validated.clear()
    job.execute_in_process(partition_key=partition, instance=instance)
    assert validated == []
