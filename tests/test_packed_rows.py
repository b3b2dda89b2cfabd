"""The windowed reader of packed arrays returns exactly np.load's rows, from a local file and
from an fsspec filesystem, reading no more than a window at a time, and names what is wrong
with a damaged file; the writer puts rows exactly where np.load finds them."""

from __future__ import annotations

import io
import re
import tracemalloc
import uuid

import numpy as np
import pytest
from upath import UPath

from radharmony_pipeline.processing.storage import packed_rows
from radharmony_pipeline.processing.storage.packed_rows import (
    PackedArrayError,
    PackedRowReader,
    PackedRowWriter,
    read_layout,
)


def packed_array(rows: int, side: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, side, side), dtype=np.uint8)


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.fixture
def memory_path():
    """A path on fsspec's in-memory filesystem (an object store without a network)."""
    path = UPath(f"memory://packed-{uuid.uuid4().hex}/images/part.npy")
    yield path
    path.fs.rm(path.parent.path, recursive=True)


def test_local_windows_equal_np_load_and_each_read_is_at_most_a_window(tmp_path):
    array = packed_array(103, 16)
    path = tmp_path / "part.npy"
    np.save(path, array)
    expected = np.load(path)
    window = 10 * 16 * 16 + 100  # ten whole rows fit, not eleven

    with PackedRowReader(read_layout(path)) as reader:
        seen = [(first, rows.copy()) for first, rows in reader.windows(window)]
        assert np.array_equal(reader.read(37, 91), expected[37:91])

    assert [first for first, _rows in seen] == list(range(0, 103, 10))
    assert np.array_equal(np.concatenate([rows for _first, rows in seen]), expected)
    window_reads = reader.reads[: len(seen)]
    assert max(window_reads) == 10 * 16 * 16
    assert sum(window_reads) == expected.nbytes


def test_object_windows_equal_np_load_through_several_range_requests(memory_path, monkeypatch):
    array = packed_array(50, 24, seed=1)
    memory_path.fs.pipe_file(memory_path.path, npy_bytes(array))
    requests = []
    cat_file = type(memory_path.fs).cat_file

    def counted(fs, path, start=None, end=None, **kwargs):
        requests.append((start, end))
        return cat_file(fs, path, start=start, end=end, **kwargs)

    monkeypatch.setattr(type(memory_path.fs), "cat_file", counted)
    # A window spans several requests: each stays within REQUEST_BYTES.
    monkeypatch.setattr(packed_rows, "REQUEST_BYTES", 1000)
    layout = read_layout(memory_path)
    header_requests = len(requests)

    with PackedRowReader(layout) as reader:
        seen = np.concatenate([rows.copy() for _first, rows in reader.windows(7 * 24 * 24)])
        assert np.array_equal(reader.read(3, 4)[0], array[3])

    assert np.array_equal(seen, array)
    assert header_requests == 2  # the prefix, then exactly the header it announces
    window_requests = requests[header_requests:]
    assert max(end - start for start, end in window_requests) <= 1000
    assert window_requests[0][0] == layout.data_offset
    assert max(reader.reads) == 7 * 24 * 24


def test_a_window_larger_than_the_array_reads_it_once(tmp_path):
    array = packed_array(5, 8)
    path = tmp_path / "small.npy"
    np.save(path, array)
    with PackedRowReader(read_layout(path)) as reader:
        (first, rows), *rest = list(reader.windows(1 << 20))
    assert first == 0 and not rest
    assert np.array_equal(rows, array)
    assert reader.reads == [array.nbytes]


def test_reading_a_large_array_in_windows_holds_one_window(tmp_path):
    array = packed_array(1024, 128)  # 16 MiB of rows
    path = tmp_path / "large.npy"
    np.save(path, array)
    del array
    window = 256 << 10

    tracemalloc.start()
    try:
        with PackedRowReader(read_layout(path)) as reader:
            windows = reader.windows(window)
            checksum = sum(int(rows.sum(dtype=np.uint64)) for _first, rows in windows)
        _current, windowed_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        whole = np.load(path)
        whole_sum = int(whole.sum(dtype=np.uint64))
        _current, whole_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert checksum == whole_sum
    # The measure sees a whole load (so it would see a reader that loads whole)...
    assert whole_peak >= whole.nbytes
    # ... and the windowed reader holds one window (plus small bookkeeping).
    assert windowed_peak < window + (128 << 10)
    assert len(reader.reads) == whole.nbytes // window


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda content: content[:-100], "truncated: "),
        (lambda content: content + b"\0" * 7, "7 bytes after its last row"),
        (lambda content: b"PK" + content[2:], "not a readable .npy header"),
        (lambda content: content[:5], "not a readable .npy header"),
    ],
)
def test_a_damaged_file_is_named_with_its_problem(tmp_path, memory_path, damage, problem):
    content = damage(npy_bytes(packed_array(10, 8)))
    local = tmp_path / "damaged.npy"
    local.write_bytes(content)
    memory_path.fs.pipe_file(memory_path.path, content)
    for path in (local, memory_path):
        with pytest.raises(PackedArrayError) as raised:
            read_layout(path)
        assert raised.value.problem.startswith(problem)
        assert str(path) in str(raised.value)


def test_fortran_ordered_and_object_arrays_are_refused(tmp_path):
    fortran = tmp_path / "fortran.npy"
    np.save(fortran, np.asfortranarray(packed_array(4, 8)))
    with pytest.raises(PackedArrayError, match="Fortran order"):
        read_layout(fortran)
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([None, 1], dtype=object), allow_pickle=True)
    with pytest.raises(PackedArrayError, match="Python objects"):
        read_layout(objects)


def test_rows_outside_the_array_are_an_index_error(tmp_path):
    path = tmp_path / "part.npy"
    np.save(path, packed_array(4, 8))
    with PackedRowReader(read_layout(path)) as reader, pytest.raises(IndexError, match="rows"):
        reader.read(2, 5)


def test_rows_written_in_place_are_where_np_load_reads_them_and_nothing_else_changes(tmp_path):
    path = tmp_path / "part.npy"
    np.save(path, np.zeros((40, 12, 12), np.uint8))
    before = path.read_bytes()
    new = packed_array(6, 12, seed=3)

    with PackedRowWriter(path) as writer:
        writer.write(0, new[0])  # one row, in the row's own shape
        writer.write(17, new[1:4])  # a run of rows
        writer.write(39, new[4:5])  # the last row
        writer.write(5, new[:0])  # no row at all

    after = np.load(path)
    assert np.array_equal(after[0], new[0])
    assert np.array_equal(after[17:20], new[1:4])
    assert np.array_equal(after[39], new[4])
    untouched = np.ones(40, bool)
    untouched[[0, 17, 18, 19, 39]] = False
    assert not after[untouched].any()
    assert len(path.read_bytes()) == len(before)
    assert (
        path.read_bytes()[: read_layout(path).data_offset]
        == before[: read_layout(path).data_offset]
    )


def test_a_writer_refuses_rows_outside_the_array_other_shapes_and_writes_after_close(tmp_path):
    path = tmp_path / "part.npy"
    np.save(path, np.zeros((5, 8, 8), np.uint8))
    writer = PackedRowWriter(path)
    with pytest.raises(IndexError, match="rows \\[4, 6\\) outside its 5"):
        writer.write(4, packed_array(2, 8))
    with pytest.raises(IndexError, match="outside"):
        writer.write(-1, packed_array(1, 8))
    with pytest.raises(
        ValueError, match=re.escape("rows of (1, 9, 9) uint8, the array's are (8, 8)")
    ):
        writer.write(0, packed_array(1, 9))
    with pytest.raises(ValueError, match="uint16"):  # not the array's pixels
        writer.write(0, np.zeros((8, 8), np.uint16))
    with pytest.raises(ValueError, match=re.escape("rows of (4, 16)")):  # as many bytes, not a row
        writer.write(0, packed_array(1, 16)[0, :4])
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(0, packed_array(1, 8))
    assert not np.load(path).any()
