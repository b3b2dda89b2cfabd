"""`radharmony verify` on a partition written directly (no Dagster build): damage found with
its messages, packed arrays read one window at a time, progress reported in outputs, the
same findings on the local pool, in-process and on Dask."""

from __future__ import annotations

import hashlib
import tracemalloc
import uuid
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
from upath import UPath

from radharmony_pipeline import cli
from radharmony_pipeline.operations.verify import verify_outputs
from radharmony_pipeline.processing.execution.cluster import DaskCluster, LocalPool
from radharmony_pipeline.processing.imaging.perceptual_hash import pixels_sha256
from radharmony_pipeline.processing.imaging.tagged_png import (
    INPUT_KEY_TAG,
    leading_text_tags,
    radiograph_png,
    read_png_tags,
    with_text_tags,
    write_tagged_png,
)
from radharmony_pipeline.processing.storage import integrity
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.packed_rows import PackedRowReader, read_layout
from radharmony_pipeline.vocabulary import STATUS_ERROR, STATUS_OK, UNION_CLASS

PARTITION = "chestx_det.test"
SIDE = 32
ROW_BYTES = SIDE * SIDE


def png(pixels: np.ndarray) -> bytes:
    """A PNG as the images stage writes one: its pixels' digest among its tags."""
    return with_text_tags(radiograph_png(pixels), {integrity.PIXEL_DIGEST: pixels_sha256(pixels)})


def untagged_png(pixels: np.ndarray) -> bytes:
    encoded, buffer = cv2.imencode(".png", pixels)
    assert encoded
    return buffer.tobytes()


def write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def write_partition(root: Path, rows: int, with_pngs: bool = True) -> np.ndarray:
    """An images table (the last row an error row), its packed array and PNGs, a masks
    table naming a native mask per image, and the array's key record; returns the pixels."""
    rng = np.random.default_rng(rows)
    pixels = rng.integers(0, 256, (rows, SIDE, SIDE), dtype=np.uint8)
    pixels[-1] = 0  # an error row's pixels stay zero
    keys = [f"img{row:05d}" for row in range(rows)]
    ok = [STATUS_OK] * (rows - 1) + [STATUS_ERROR]
    images = pd.DataFrame(
        {
            "image_id": keys,
            "image_path": [
                layout.resized_image(PARTITION, key) if with_pngs and state == STATUS_OK else None
                for key, state in zip(keys, ok, strict=True)
            ],
            "mask_path": [
                layout.resized_union_mask(PARTITION, key)
                if with_pngs and row % 2 and state == STATUS_OK
                else None
                for row, (key, state) in enumerate(zip(keys, ok, strict=True))
            ],
            "pixels_sha256": [pixels_sha256(p) for p in pixels[:-1]] + [None],
            "tensor_index": list(range(rows)),
            "status": ok,
        }
    )
    masks = pd.DataFrame(
        {
            "image_id": keys[:3],
            "mask_path": [
                f"{layout.image_mask_folder(PARTITION, k)}/{UNION_CLASS}.png" for k in keys[:3]
            ],
            "status": [STATUS_OK] * 3,
        }
    )
    for name, table in (("images", images), ("masks", masks)):
        path = layout.table_file(root, name, PARTITION)
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(path)
    for relative in images["image_path"].dropna():
        row = keys.index(Path(relative).stem)
        write(root / relative, png(pixels[row]))
    for relative in [*images["mask_path"].dropna(), *masks["mask_path"]]:
        write(root / relative, untagged_png((pixels[0] > 127).astype(np.uint8) * 255))
    packed = root / layout.packed_images(PARTITION)
    packed.parent.mkdir(parents=True, exist_ok=True)
    np.save(packed, pixels)
    layout.packed_keys(packed).write_text("[]")
    return pixels


def flip_byte(path: Path, offset: int) -> None:
    content = bytearray(path.read_bytes())
    content[offset] ^= 0x5A
    path.write_bytes(bytes(content))


def damage(root: Path) -> dict[str, str]:
    """A flipped byte in a PNG, in packed row 5 and a missing mask; what verify must say."""
    pngs = sorted((root / layout.resized_image_folder(PARTITION)).rglob("img*[0-9].png"))
    flip_byte(pngs[1], len(pngs[1].read_bytes()) // 2)
    packed = root / layout.packed_images(PARTITION)
    flip_byte(packed, read_layout(packed).data_offset + 5 * ROW_BYTES + 7)
    mask = root / layout.resized_union_mask(PARTITION, "img00003")
    mask.unlink()
    return {
        str(pngs[1]): "chunk does not match its checksum",
        str(packed): "1 rows differ from their PNGs' digests: 5",
        str(mask): "missing",
    }


def found(mismatches) -> dict[str, str]:
    return {m.path: m.problem for m in mismatches}


def assert_found(mismatches, expected: dict[str, str]) -> None:
    problems = found(mismatches)
    assert set(problems) == set(expected), [str(m) for m in mismatches]
    for path, text in expected.items():
        assert text in problems[path], problems[path]


def test_a_clean_partition_verifies_with_progress_up_to_every_output(tmp_path):
    write_partition(tmp_path, rows=30)
    reports = []
    window = 4 * ROW_BYTES
    mismatches = verify_outputs(
        tmp_path, [PARTITION], None, LocalPool(1), lambda *done: reports.append(done), window
    )
    assert mismatches == []
    assert layout.packed_keys(tmp_path / layout.packed_images(PARTITION)).exists()
    # 29 image PNGs (the last row is an error row), 14 union masks, 3 native masks, 30 rows.
    total = 29 + 14 + 3 + 30
    assert reports[-1] == (total, total)
    done = [d for d, _total in reports]
    assert done == sorted(done) and len(reports) == 30 // 4 + 1 + 1  # 8 windows, one mask chunk


def test_damaged_files_and_rows_are_named_and_the_keys_withdrawn(tmp_path):
    write_partition(tmp_path, rows=30)
    expected = damage(tmp_path)
    mismatches = verify_outputs(tmp_path, [PARTITION], None, LocalPool(1), window_bytes=ROW_BYTES)
    assert_found(mismatches, expected)
    packed = tmp_path / layout.packed_images(PARTITION)
    assert not layout.packed_keys(packed).exists()


def test_tagged_pngs_are_not_decoded_and_an_untagged_one_is(tmp_path, monkeypatch):
    pixels = write_partition(tmp_path, rows=12)
    untagged = tmp_path / layout.resized_image(PARTITION, "img00004")
    untagged.write_bytes(untagged_png(pixels[4]))  # the same pixels, without the digest tag
    decoded = []
    decode = integrity.read_grayscale_png

    def counted(path, content=None):
        decoded.append(Path(path))
        return decode(path, content)

    monkeypatch.setattr(integrity, "read_grayscale_png", counted)
    assert verify_outputs(tmp_path, [PARTITION], None) == []
    assert decoded == [untagged]


def test_a_png_with_other_pixels_and_a_truncated_array_are_found(tmp_path):
    pixels = write_partition(tmp_path, rows=12)
    image = tmp_path / layout.resized_image(PARTITION, "img00002")
    image.write_bytes(png(pixels[3]))  # a whole PNG, but another image's pixels and tag
    untagged = tmp_path / layout.resized_image(PARTITION, "img00005")
    untagged.write_bytes(untagged_png(pixels[6]))
    packed = tmp_path / layout.packed_images(PARTITION)
    packed.write_bytes(packed.read_bytes()[:-100])
    problems = found(verify_outputs(tmp_path, [PARTITION], None))
    assert set(problems) == {str(image), str(untagged), str(packed)}
    assert problems[str(image)].startswith("pixels differ from their recorded digest (")
    assert problems[str(untagged)].startswith("pixels differ from their recorded digest (")
    assert problems[str(packed)].startswith("unreadable array (truncated?): truncated: ")


def test_an_array_of_another_shape_is_named_with_the_rows_expected(tmp_path):
    pixels = write_partition(tmp_path, rows=6)
    packed = tmp_path / layout.packed_images(PARTITION)
    np.save(packed, pixels[:5])
    problems = found(verify_outputs(tmp_path, [PARTITION], None))
    assert problems == {str(packed): f"shape (5, {SIDE}, {SIDE}), 6 rows expected"}


class CountingReader(PackedRowReader):
    """Records every read of every reader verify opens (verify runs in this process)."""

    all_reads: list[int] = []

    def read_into(self, start: int, out: np.ndarray) -> np.ndarray:
        CountingReader.all_reads.append(out.nbytes)
        return super().read_into(start, out)


def test_an_array_far_larger_than_its_window_is_read_one_window_at_a_time(tmp_path, monkeypatch):
    rows = 4096  # 4 MiB of rows, no PNGs: the rows alone are checked
    write_partition(tmp_path, rows=rows, with_pngs=False)
    CountingReader.all_reads = []
    monkeypatch.setattr(integrity, "PackedRowReader", CountingReader)
    window = 64 << 10

    tracemalloc.start()
    try:
        mismatches = verify_outputs(tmp_path, [PARTITION], None, window_bytes=window)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert mismatches == []
    assert max(CountingReader.all_reads) == window
    assert sum(CountingReader.all_reads) == rows * ROW_BYTES  # each row read once
    # The parent's tables and bookkeeping plus one window, far below the 4 MiB array.
    assert peak < (rows * ROW_BYTES) // 2, peak


def test_the_pool_of_two_and_the_command_find_what_one_process_finds(tmp_path, monkeypatch, capsys):
    write_partition(tmp_path, rows=40)
    expected = damage(tmp_path)
    pooled = verify_outputs(tmp_path, [PARTITION], None, LocalPool(2), window_bytes=4 * ROW_BYTES)
    assert_found(pooled, expected)

    monkeypatch.setenv("RADHARMONY_WORKERS", "2")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("RADHARMONY_DASK_SCHEDULER", raising=False)
    code = cli.main(["verify", "--partition", PARTITION, "--output-root", str(tmp_path)])
    printed = capsys.readouterr()
    assert code == 1
    assert all(f"{path}: " in printed.out for path in expected)
    total = 39 + 19 + 3 + 40  # the removed union mask counts as checked
    assert f"radharmony verify: {total}/{total} outputs checked in " in printed.err


@pytest.mark.cluster
def test_verify_on_dask_finds_what_the_pool_finds(tmp_path):
    from distributed import LocalCluster

    write_partition(tmp_path, rows=40)
    expected = damage(tmp_path)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as local:
        executor = DaskCluster(local.scheduler_address)
        on_dask = verify_outputs(tmp_path, [PARTITION], None, executor, window_bytes=ROW_BYTES)
    assert_found(on_dask, expected)


def test_on_an_object_store_the_array_is_read_in_range_requests_of_a_window(tmp_path, monkeypatch):
    write_partition(tmp_path, rows=64)
    root = UPath(f"memory://verify-{uuid.uuid4().hex}/output")
    root.fs.put(f"{tmp_path}/", root.path, recursive=True)
    packed = root / layout.packed_images(PARTITION)
    content = bytearray(root.fs.cat_file(packed.path))
    content[read_layout(packed).data_offset + 40 * ROW_BYTES + 3] ^= 0x5A  # row 40
    root.fs.pipe_file(packed.path, bytes(content))
    array_requests = []
    cat_file = type(root.fs).cat_file

    def counted(fs, path, start=None, end=None, **kwargs):
        if path.endswith(".npy"):
            array_requests.append((start, end))
        return cat_file(fs, path, start=start, end=end, **kwargs)

    monkeypatch.setattr(type(root.fs), "cat_file", counted)
    try:
        mismatches = verify_outputs(root, [PARTITION], None, window_bytes=8 * ROW_BYTES)
    finally:
        root.fs.rm(root.parent.path, recursive=True)

    assert found(mismatches) == {str(packed): "1 rows differ from their PNGs' digests: 40"}
    # Never the whole object: the header, then one range of at most a window per request.
    assert all(start is not None and end is not None for start, end in array_requests)
    assert max(end - start for start, end in array_requests) <= 8 * ROW_BYTES
    assert sum(end - start for start, end in array_requests[2:]) == 64 * ROW_BYTES


def test_a_table_unlike_its_record_or_with_a_damaged_page_is_named(tmp_path):
    write_partition(tmp_path, rows=6)
    path = layout.table_file(tmp_path, "images", PARTITION)
    table = pd.read_parquet(path)
    table.to_parquet(path, write_page_checksum=True)
    recorded = {PARTITION: {"images": hashlib.sha256(path.read_bytes()).hexdigest()}}
    assert integrity.verify_partitions(tmp_path, recorded, LocalPool(1))[0].mismatches == []

    table.loc[0, "image_id"] = "another"  # readable, but not the table recorded
    table.to_parquet(path, write_page_checksum=True)
    (changed,) = integrity.verify_partitions(tmp_path, recorded, LocalPool(1))[0].mismatches
    assert changed.path == str(path)
    assert changed.problem.startswith("SHA-256 differs from the one recorded when it was written")

    # Inside a page of the digest column (its footer's statistics carry no checksum).
    flip_byte(path, path.read_bytes().index(table[integrity.PIXEL_DIGEST][2].encode()) + 5)
    (damaged,) = integrity.verify_partitions(tmp_path, {PARTITION: {}}, LocalPool(1))[0].mismatches
    assert damaged.path == str(path)
    assert damaged.problem.startswith("unreadable Parquet: ")


def test_the_leading_tags_read_without_pillow_are_pillows_latin1_tags(tmp_path):
    pixels = np.arange(64, dtype=np.uint8).reshape(8, 8)
    path = tmp_path / "tagged.png"
    tags = {integrity.PIXEL_DIGEST: pixels_sha256(pixels), "scale": "0.5"}
    write_tagged_png(path, lambda: pixels, "снимок/01.png", tags)  # the key needs iTXt
    content = path.read_bytes()
    assert leading_text_tags(content) == {**tags}
    assert read_png_tags(path) == {INPUT_KEY_TAG: "снимок/01.png", **tags}
    assert leading_text_tags(untagged_png(pixels)) == {}
