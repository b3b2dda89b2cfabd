"""Training from object storage in blocks: ManifestDataset reading its packed rows
`read_block_rows` at a time serves the very samples it serves row by row, with one read per
block when BlockShuffleSampler orders the samples; the sampler's order is a seeded
permutation whose windows each span at most `window_blocks` blocks; PackedBlockReader keeps
the most recently used blocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from radharmony_pipeline import loader
from radharmony_pipeline.loader import BlockShuffleSampler, ManifestDataset
from radharmony_pipeline.processing.storage.packed_rows import (
    PackedBlockReader,
    PackedRowReader,
    read_layout,
)

SIDE = 16
PACKED = 45  # rows of the packed array: the last block of 8 is short
PNG_ONLY = 5  # samples with no packed row, read from their PNGs
BLOCK = 8


@pytest.fixture(autouse=True)
def numpy_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "torch", None)


def pixels(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, SIDE, SIDE), dtype=np.uint8)


@pytest.fixture
def training_root(tmp_path: Path) -> tuple[pd.DataFrame, Path]:
    """A manifest of PACKED samples of one packed array (listed out of row order) and
    PNG_ONLY samples read from their PNGs; its output root."""
    from PIL import Image

    root = tmp_path / "output"
    (root / "tensors").mkdir(parents=True)
    np.save(root / "tensors" / "train.npy", pixels(PACKED, 0))
    for number, picture in enumerate(pixels(PNG_ONLY, 1)):
        Image.fromarray(picture).save(root / f"png{number}.png")
    order = np.random.default_rng(2).permutation(PACKED)
    rows = len(order) + PNG_ONLY
    frame = pd.DataFrame({column: [None] * rows for column in loader._SAMPLE_COLUMNS})
    frame["image_id"] = [f"i{n}" for n in range(rows)]
    frame["dataset"], frame["split"], frame["has_mask"] = "rexgradient", "train", False
    frame["tensor_path"] = ["tensors/train.npy"] * PACKED + [None] * PNG_ONLY
    frame["tensor_index"] = pd.array([*order.tolist(), *[None] * PNG_ONLY], dtype="Int64")
    frame["image_path"] = [f"unused{n}.png" for n in range(PACKED)] + [
        f"png{n}.png" for n in range(PNG_ONLY)
    ]
    return frame, root


def test_blocks_serve_the_samples_rows_serve_with_one_read_per_block(training_root):
    frame, root = training_root
    by_row = ManifestDataset(frame, output_root=root)
    by_block = ManifestDataset(frame, output_root=root, read_block_rows=BLOCK)
    sampler = BlockShuffleSampler(by_block, window_blocks=2, seed=3)

    for position in sampler:
        np.testing.assert_array_equal(by_block[position]["img"], by_row[position]["img"])

    (reader,) = by_block._packed.values()
    blocks = -(-PACKED // BLOCK)
    assert len(reader.rows.reads) == blocks  # the window's blocks stay while it is drawn
    row_bytes = SIDE * SIDE
    assert sorted(reader.rows.reads) == [(PACKED % BLOCK) * row_bytes] + [BLOCK * row_bytes] * (
        blocks - 1
    )
    (row_reader,) = by_row._packed.values()
    assert len(row_reader.rows.reads) == PACKED


@pytest.mark.parametrize("window_blocks", [1, 3, 100])
def test_each_window_of_the_order_spans_at_most_its_blocks(training_root, window_blocks):
    frame, root = training_root
    dataset = ManifestDataset(frame, output_root=root, read_block_rows=BLOCK)
    order = list(BlockShuffleSampler(dataset, window_blocks=window_blocks, seed=0))

    assert sorted(order) == list(range(len(dataset)))  # every sample once
    index = dataset.table["tensor_index"]
    block_of = [
        ("packed", int(index[p]) // BLOCK) if p < PACKED else ("png", p // BLOCK)
        for p in range(len(dataset))
    ]
    blocks = set(block_of)
    # Walk the order window by window: a window is the samples of its blocks, whole.
    seen, position = 0, 0
    while position < len(order):
        window_blocks_seen: set = set()
        size = 0
        while position + size < len(order) and len(window_blocks_seen) <= window_blocks:
            block = block_of[order[position + size]]
            if block not in window_blocks_seen and len(window_blocks_seen) == window_blocks:
                break
            window_blocks_seen.add(block)
            size += 1
        members = {p for p in range(len(dataset)) if block_of[p] in window_blocks_seen}
        assert set(order[position : position + size]) == members
        seen += len(window_blocks_seen)
        position += size
    assert seen == len(blocks)


def test_the_order_is_seeded_and_differs_per_epoch(training_root):
    frame, root = training_root
    dataset = ManifestDataset(frame, output_root=root, read_block_rows=BLOCK)
    sampler, again = BlockShuffleSampler(dataset, seed=5), BlockShuffleSampler(dataset, seed=5)
    first = list(sampler)
    assert list(again) == first
    sampler.set_epoch(1)
    assert list(sampler) != first
    assert len(sampler) == len(dataset)


def test_block_and_window_sizes_below_one_are_refused(training_root):
    frame, root = training_root
    with pytest.raises(ValueError, match="read_block_rows must be at least 1, got 0"):
        ManifestDataset(frame, output_root=root, read_block_rows=0)
    dataset = ManifestDataset(frame, output_root=root)
    with pytest.raises(ValueError, match="window_blocks must be at least 1, got 0"):
        BlockShuffleSampler(dataset, window_blocks=0)


def test_the_block_reader_keeps_the_most_recently_used_blocks(tmp_path):
    array = pixels(20, 4)
    np.save(tmp_path / "a.npy", array)
    reader = PackedBlockReader(PackedRowReader(read_layout(tmp_path / "a.npy")), 4, 2)

    for index in (0, 5, 1, 9, 6, 2):  # blocks 0, 1, 0 (kept), 2 (drops 1), 1 (again), 0
        np.testing.assert_array_equal(reader.row(index), array[index])
    assert len(reader.rows.reads) == 5
    with pytest.raises(IndexError, match="row 20 outside its 20 rows"):
        reader.row(20)


def worker_reads(frame: pd.DataFrame, root: Path, order: list[int], workers: int, batch: int):
    """Reads of the packed array when a DataLoader deals batch k of `order` to worker
    k mod `workers`, each worker with its own copy of the dataset."""
    import pickle

    dataset = ManifestDataset(frame, output_root=root, read_block_rows=BLOCK)
    copies = [pickle.loads(pickle.dumps(dataset)) for _ in range(workers)]
    for number, first in enumerate(range(0, len(order), batch)):
        for position in order[first : first + batch]:
            copies[number % workers][position]
    return sum(len(reader.rows.reads) for copy in copies for reader in copy._packed.values())


@pytest.mark.parametrize("workers, batch", [(2, 4), (4, 3), (3, 8)])
def test_with_loader_workers_each_block_is_read_by_one_worker(tmp_path, workers, batch):
    """Every sample once, and each block read by one worker but for the few last batches
    (after the shortest share ends); ordered without the workers, each worker reads most
    blocks of a window."""
    blocks, side = 60, 4
    root = tmp_path / "output"
    (root / "tensors").mkdir(parents=True)
    np.save(root / "tensors" / "train.npy", np.zeros((blocks * BLOCK, side, side), np.uint8))
    rows = blocks * BLOCK
    frame = pd.DataFrame({column: [None] * rows for column in loader._SAMPLE_COLUMNS})
    frame["image_id"] = [f"i{n}" for n in range(rows)]
    frame["has_mask"], frame["tensor_path"] = False, "tensors/train.npy"
    frame["tensor_index"] = pd.array(np.random.default_rng(6).permutation(rows), dtype="Int64")
    dataset = ManifestDataset(frame, output_root=root, read_block_rows=BLOCK)

    dealt = list(BlockShuffleSampler(dataset, seed=1, batch_size=batch, num_workers=workers))
    assert sorted(dealt) == list(range(rows))
    assert blocks <= worker_reads(frame, root, dealt, workers, batch) <= blocks + 2 * workers

    mixed = list(BlockShuffleSampler(dataset, seed=1))
    assert worker_reads(frame, root, mixed, workers, batch) > 1.5 * blocks


def test_loader_sizes_below_their_least_are_refused(training_root):
    frame, root = training_root
    dataset = ManifestDataset(frame, output_root=root, read_block_rows=BLOCK)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        BlockShuffleSampler(dataset, batch_size=0)
    with pytest.raises(ValueError, match="num_workers must be at least 0, got -1"):
        BlockShuffleSampler(dataset, num_workers=-1)
