"""The output root on object storage: atomic publishing, listings, and the `images` packing
on an S3 server (moto's, in a thread on loopback) compared with a local folder."""

from __future__ import annotations

import io
import socket
import threading
from dataclasses import replace
from pathlib import PurePosixPath

import numpy as np
import pytest
from PIL import Image

from radharmony_pipeline.processing.execution.cluster import LocalPool
from radharmony_pipeline.processing.imaging.perceptual_hash import pixels_sha256
from radharmony_pipeline.processing.imaging.tagged_png import radiograph_png, with_text_tags
from radharmony_pipeline.processing.jobs import image_jobs as image_jobs_module
from radharmony_pipeline.processing.jobs.image_jobs import ImageJob, build_packed_images
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER, write_atomically
from radharmony_pipeline.processing.storage.store import (
    exists,
    file_size,
    holds_bytes,
    listing,
    output_path,
    publish,
    publish_file,
    read_bytes,
)

BUCKET = "storage-test"
SIZE = 32


# The S3 tests here share the module's moto server; each starts with a fresh s3fs client.
pytestmark = pytest.mark.usefixtures("fresh_s3_clients_for_module", "fresh_s3_clients")


@pytest.fixture
def bucket(on_s3_server, monkeypatch):
    monkeypatch.delenv("RADHARMONY_DASK_SCHEDULER", raising=False)
    root = output_path(f"s3://{BUCKET}")
    if not root.fs.exists(BUCKET):
        root.fs.mkdir(BUCKET)
    return root


def all_keys(root) -> set[str]:
    root.fs.invalidate_cache()
    return listing(root)


def test_publish_makes_the_object_visible_and_leaves_no_temporary_key(bucket):
    target = bucket / "publish" / "table.bin"
    publish(target, lambda handle: handle.write(b"complete"))
    assert target.read_bytes() == b"complete"
    assert {key for key in all_keys(bucket) if key.startswith("publish/")} == {"publish/table.bin"}


def test_publishing_an_object_is_one_upload_to_its_own_key(bucket, tmp_path, monkeypatch):
    """A PUT is atomic on object storage: no temporary key, copy or delete around it."""
    fs = bucket.fs
    calls = []
    for name in ("pipe_file", "put_file", "cp_file", "copy", "rm_file", "rm", "mv"):
        original = getattr(fs, name)

        def recorded(*args, _name=name, _original=original, **kwargs):
            calls.append((_name, args[0] if _name == "pipe_file" else args))
            return _original(*args, **kwargs)

        monkeypatch.setattr(fs, name, recorded)
    table = bucket / "single-put" / "table.parquet"
    publish(table, lambda handle: handle.write(b"the table"))
    local = tmp_path / "array.npy"
    local.write_bytes(b"the array")
    array = bucket / "single-put" / "array.npy"
    publish_file(array, local)
    assert calls == [("pipe_file", table.path), ("pipe_file", array.path)]
    assert read_bytes(table) == b"the table" and read_bytes(array) == b"the array"


def test_only_a_local_file_of_the_very_same_bytes_holds_them(bucket, tmp_path):
    table = tmp_path / "table.parquet"
    assert not holds_bytes(table, b"")  # no file yet
    table.write_bytes(b"abcdef")
    assert holds_bytes(table, b"abcdef")
    assert not holds_bytes(table, b"abcdeg")  # same size, one byte else
    assert not holds_bytes(table, b"abcde")
    assert not holds_bytes(table, b"abcdefg")
    assert not holds_bytes(tmp_path, b"")  # a folder
    stored = bucket / "holds" / "table.parquet"
    publish(stored, lambda handle: handle.write(b"abcdef"))
    # An object is written again: an identical upload keeps its ETag.
    assert not holds_bytes(stored, b"abcdef")


def test_a_failed_write_leaves_neither_object_nor_temporary_key(bucket):
    target = bucket / "failed" / "table.bin"
    publish(target, lambda handle: handle.write(b"old"))

    def broken(handle):
        handle.write(b"half")
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        publish(target, broken)
    assert {key for key in all_keys(bucket) if key.startswith("failed/")} == {"failed/table.bin"}
    assert target.read_bytes() == b"old"


def test_an_object_another_process_wrote_after_this_one_listed_its_folder_is_seen(bucket):
    # The step lists an output folder (clean-up, re-use), then its pool's workers write into
    # it with filesystems of their own: s3fs's cached listing must not hide their objects.
    import s3fs

    folder = bucket / "written-elsewhere"
    publish(folder / "first.png", lambda handle: handle.write(b"first"))
    assert [info["name"] for info in folder.fs.ls(folder.path, detail=True)] == [
        f"{folder.path}/first.png"
    ]  # now cached in this process
    worker = s3fs.S3FileSystem(skip_instance_cache=True)
    worker.pipe_file(f"{folder.path}/second.png", b"second")
    written = folder / "second.png"
    assert exists(written)
    assert file_size(written) == len(b"second")
    assert read_bytes(written) == b"second"


def test_listing_is_relative_and_empty_for_a_missing_prefix(bucket):
    for name in ("a/1.png", "a/b/2.png", "c.png"):
        publish(bucket / "listed" / name, lambda handle: handle.write(b"x"))
    assert listing(bucket / "listed") == {"a/1.png", "a/b/2.png", "c.png"}
    assert listing(bucket / "nothing-here") == set()


def write_sources(folder, count):
    folder.mkdir()
    rng = np.random.default_rng(3)
    paths = []
    for index in range(count):
        pixels = rng.integers(0, 256, size=(40 + index, 50), dtype=np.uint8)
        path = folder / f"image{index}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    (folder / "broken.png").write_bytes(b"not a png")
    return [*paths, folder / "broken.png"]


def image_jobs(sources, root):
    return [
        ImageJob(
            image_id=source.stem,
            source_file=source,
            union_mask_file=None,
            output_root=root,
            image_relative=layout.resized_image("p", source.stem),
            mask_relative=None,
            size=SIZE,
            resize="letterbox",
            row=row,
        )
        for row, source in enumerate(sources)
    ]


def test_packed_images_on_s3_equal_a_local_build_and_a_rerun_decodes_nothing(bucket, tmp_path):
    sources = write_sources(tmp_path / "sources", 5)
    local_root = tmp_path / "local"
    local_rows = build_packed_images(
        image_jobs(sources, local_root), local_root / layout.packed_images("p"), SIZE, LocalPool(1)
    )
    remote_root = bucket / "corpus"
    packed = remote_root / layout.packed_images("p")
    remote_rows = build_packed_images(image_jobs(sources, remote_root), packed, SIZE, LocalPool(1))

    assert remote_rows == local_rows
    assert [row.status for row in remote_rows] == ["ok"] * 5 + ["error"]
    remote_array = np.load(io.BytesIO(packed.read_bytes()))
    np.testing.assert_array_equal(remote_array, np.load(local_root / layout.packed_images("p")))
    keys = all_keys(remote_root)
    assert not [key for key in keys if TEMP_MARKER in key]
    assert str(layout.packed_keys(PurePosixPath(layout.packed_images("p")))) in keys
    for source in sources[:5]:
        relative = layout.resized_image("p", source.stem)
        assert (remote_root / relative).read_bytes() == (local_root / relative).read_bytes()

    rerun = build_packed_images(image_jobs(sources, remote_root), packed, SIZE, LocalPool(1))
    assert [row.decoded for row in rerun if row.status == "ok"] == [False] * 5
    np.testing.assert_array_equal(np.load(io.BytesIO(packed.read_bytes())), remote_array)


def test_an_unchanged_partition_on_s3_is_verified_from_headers(bucket, tmp_path, monkeypatch):
    sources = write_sources(tmp_path / "sources", 4)[:4]
    root = bucket / "verified"
    packed = root / layout.packed_images("p")
    first = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))
    assert [row.decoded for row in first] == [True] * 4

    def no_upload(*args, **kwargs):
        raise AssertionError("an unchanged partition must not be uploaded again")

    monkeypatch.setattr(image_jobs_module, "publish_file", no_upload)
    monkeypatch.setattr(image_jobs_module, "publish", no_upload)
    again = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))
    assert again == [replace(row, decoded=False) for row in first]


def write_training_output(root):
    """test_loader's images and their manifest under the output root `root`; `root`."""
    import pyarrow.parquet as pq
    from test_loader import manifest_table, write_images

    table = manifest_table(write_images(root))
    layout.tables_folder(root).mkdir(parents=True)
    pq.write_table(table, root / layout.MANIFEST)
    return root


def test_the_loader_and_the_duplicate_sheet_retry_transient_store_faults(
    bucket, tmp_path, monkeypatch
):
    """ManifestDataset on an s3:// manifest, and the near-duplicate checks' sheet lookup, go
    through the storage layer's retries: the first reads and lookups are cut connections."""
    import s3fs

    from radharmony_pipeline import loader
    from radharmony_pipeline.defs.checks import duplicates

    monkeypatch.setattr(loader, "torch", None)
    local = write_training_output(tmp_path / "output")
    (local / layout.NEAR_DUPLICATE_SHEET).parent.mkdir(parents=True, exist_ok=True)
    (local / layout.NEAR_DUPLICATE_SHEET).write_bytes(b"sheet")
    bucket.fs.put(f"{local}/", f"{BUCKET}/loader/", recursive=True)
    bucket.fs.invalidate_cache()

    faults = {"get_object": 3, "head_object": 2}
    original = s3fs.S3FileSystem._call_s3

    async def flaky(self, method, *args, **kwargs):
        if faults.get(method, 0) > 0:
            faults[method] -= 1
            raise ConnectionResetError(f"{method}: connection reset (injected by the test)")
        return await original(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", flaky)
    remote = loader.ManifestDataset(f"s3://{BUCKET}/loader/{layout.MANIFEST}")
    expected = loader.ManifestDataset(local / layout.MANIFEST)
    assert len(remote) == len(expected)
    for got, want in zip(remote, expected, strict=True):
        np.testing.assert_array_equal(got["img"], want["img"])
        np.testing.assert_array_equal(got["mask"], want["mask"])
    outputs = type("Outputs", (), {"root": lambda self: bucket / "loader"})()
    bucket.fs.invalidate_cache()
    assert "examples" in duplicates._sheet(outputs)
    assert faults == {"get_object": 0, "head_object": 0}  # every injected fault was met


def test_loader_workers_forked_from_a_process_that_read_samples_read_their_own(
    bucket, tmp_path, capfd
):
    """A sample read from the bucket in the training process (its array open, its S3 client
    made), then a DataLoader whose workers are forked from it, twice: every worker opens its
    own array and client (s3fs refuses a client made in another process: "This class is not
    fork-safe") and the samples are the local ones; nothing is reported on stderr."""
    from torch.utils.data import DataLoader

    from radharmony_pipeline import loader

    local = write_training_output(tmp_path / "output")
    bucket.fs.put(f"{local}/", f"{BUCKET}/forked/", recursive=True)
    bucket.fs.invalidate_cache()
    remote = loader.ManifestDataset(f"s3://{BUCKET}/forked/{layout.MANIFEST}")
    expected = [sample["img"] for sample in loader.ManifestDataset(local / layout.MANIFEST)]
    np.testing.assert_array_equal(remote[0]["img"], expected[0])  # a session in this process
    for _epoch in range(2):
        batches = DataLoader(remote, num_workers=2, collate_fn=list, multiprocessing_context="fork")
        got = [sample["img"] for batch in batches for sample in batch]
        np.testing.assert_array_equal(np.stack(got), np.stack(expected))
    written = capfd.readouterr().err
    assert "Error" not in written, written


def test_a_table_read_back_in_other_chunks_is_written_as_the_same_bytes(tmp_path):
    import dagster as dg
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_expectations import raw_index_frame

    from radharmony_pipeline.defs.io_managers import ParquetTableIOManager
    from radharmony_pipeline.defs.partitions import dataset_split_partitions

    # A declared table of several data pages (1 MB each) and writer batches (1,024 rows).
    row = raw_index_frame().drop(columns=["boxes", "follow_up"]).iloc[:1]
    frame = pd.concat([row] * 12000, ignore_index=True)  # image_path: 2.4 MB, 12 batches
    frame = frame.assign(
        image_id=[f"chestx_det/{i}" for i in range(len(frame))],
        image_path=[f"{i:0200d}.png" for i in range(len(frame))],
        dataset="chestx_det",
        split="train",
        status="ok",
        error=None,
    )
    manager = ParquetTableIOManager(base_path=output_path(str(tmp_path)))
    path = output_path(str(tmp_path / "raw_index.parquet"))

    def write(table: pd.DataFrame) -> None:
        context = dg.build_output_context(
            asset_key=dg.AssetKey("raw_index"),
            partition_key="chestx_det.train",
            asset_partitions_def=dataset_split_partitions,
        )
        manager.dump_to_path(context, table, path)

    write(frame)
    written = path.read_bytes()
    read_back = pq.read_table(path)
    # The same values in chunks that do not fall on the writer's batches.
    chunked = pa.Table.from_batches(read_back.to_batches(max_chunksize=777))
    assert chunked.column(0).num_chunks > 1
    write(chunked.to_pandas(types_mapper=pd.ArrowDtype))
    assert path.read_bytes() == written


def test_a_decoded_row_equals_the_row_read_back_from_its_png_header(tmp_path):
    # Sides whose letterbox scale has no short decimal form: the decoded row keeps the
    # computed values, a re-used one parses them from the PNG's text tags.
    folder = tmp_path / "sources"
    folder.mkdir()
    rng = np.random.default_rng(5)
    sources = []
    for index, sides in enumerate([(37, 53), (61, 29), (97, 97), (45, 83)]):
        sources.append(folder / f"odd{index}.png")
        Image.fromarray(rng.integers(0, 256, size=sides, dtype=np.uint8)).save(sources[-1])
    root = tmp_path / "out"
    packed = root / layout.packed_images("p")
    first = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))
    packed.unlink()  # assembled anew: every job re-uses its outputs from their headers

    again = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))

    assert [row.decoded for row in first] == [True] * 4
    assert [row.decoded for row in again] == [False] * 4
    assert all(len(repr(row.scale)) > 8 for row in first)
    for decoded, reused in zip(first, again, strict=True):
        assert replace(decoded, decoded=False) == reused
        for name, value in vars(decoded).items():
            assert type(value) is type(getattr(reused, name)), name


def test_an_output_whose_pixels_were_altered_under_its_key_is_decoded_and_written_again(
    tmp_path,
):
    sources = write_sources(tmp_path / "sources", 2)[:2]
    root = tmp_path / "out"
    packed = root / layout.packed_images("p")
    first = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))
    output = root / first[0].image_path
    with Image.open(output) as image:
        tags = {name: value for name, value in image.info.items() if isinstance(value, str)}
        altered = np.asarray(image).copy()
    altered[10:20, 10:20] ^= 0x55  # other pixels, a valid PNG, the same key and digest tags
    rewritten = with_text_tags(radiograph_png(altered), tags)
    output.write_bytes(rewritten)
    packed.unlink()  # assembled anew: every job looks at its outputs

    again = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))

    assert [row.decoded for row in again] == [True, False]
    assert again[0].pixels_sha256 == first[0].pixels_sha256
    assert output.read_bytes() != rewritten
    with Image.open(output) as image:
        assert pixels_sha256(np.asarray(image)) == first[0].pixels_sha256


def killed_build(tmp_path, owner=""):
    """A first build killed after four of six images: their PNGs and array rows are written,
    one of those rows is stale (other pixels under the same key), the last two are not.
    The sources, the output root, the packed array's path, the rows and array of an
    uninterrupted build."""
    sources = write_sources(tmp_path / "sources", 6)[:6]
    root = tmp_path / "out"
    packed = root / layout.packed_images("p")
    first = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))
    expected = np.load(packed)
    left = np.load(packed)
    left[1] ^= 0x33
    left[4:] = 0
    np.save(packed.with_name(f"{TEMP_MARKER}{owner}-{packed.name}"), left)
    for leftover in packed.parent.glob(f"{packed.name}*"):
        leftover.unlink()  # the build never published its array, keys or record
    for row in first[4:]:
        (root / row.image_path).unlink()
    return sources, root, packed, first, expected


def assert_resumed_as_built(again, first, packed, expected):
    assert [row.decoded for row in again] == [False, False, False, False, True, True]
    assert [replace(row, decoded=False) for row in again] == [
        replace(row, decoded=False) for row in first
    ]
    np.testing.assert_array_equal(np.load(packed), expected)
    assert not list(packed.parent.glob(f"{TEMP_MARKER}*"))


@pytest.mark.parametrize("owner", ["", "999999999@" + socket.gethostname() + "-" + "0" * 32])
def test_a_killed_builds_rows_are_kept_and_only_the_rest_is_looked_at_again(
    tmp_path, monkeypatch, owner
):
    sources, root, packed, first, expected = killed_build(tmp_path, owner)
    looked_at = []
    reuse = ImageJob._reuse
    monkeypatch.setattr(
        ImageJob, "_reuse", lambda job, key: looked_at.append(job.row) or reuse(job, key)
    )

    again = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))

    assert looked_at == [1, 4, 5]  # 0, 2, 3 taken from the array as the build left them
    assert_resumed_as_built(again, first, packed, expected)


def test_a_killed_builds_rows_are_checked_in_the_pools_worker_processes(tmp_path):
    sources, root, packed, first, expected = killed_build(tmp_path)

    again = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(2))

    assert_resumed_as_built(again, first, packed, expected)


def test_a_leftover_array_of_another_shape_is_not_taken_for_the_build(tmp_path):
    sources = write_sources(tmp_path / "sources", 3)[:3]
    root = tmp_path / "out"
    packed = root / layout.packed_images("p")
    first = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))
    expected = np.load(packed)
    for leftover in packed.parent.glob(f"{packed.name}*"):
        leftover.unlink()
    # A build of another size left its array, whose first rows hold other pixels.
    np.save(packed.with_name(f"{TEMP_MARKER}-{packed.name}"), np.ones((3, 16, 16), np.uint8))

    again = build_packed_images(image_jobs(sources, root), packed, SIZE, LocalPool(1))

    assert again == [replace(row, decoded=False) for row in first]
    np.testing.assert_array_equal(np.load(packed), expected)


def test_a_write_that_lost_the_race_to_make_its_folder_is_tried_again(tmp_path):
    # Two workers write their first images into a new shard folder at the same moment: both
    # find it missing, the other one makes it, and this one's write must still succeed.
    target = tmp_path / "images" / "cc" / "one.png"
    attempts = []

    def write_as_the_other_worker_makes_the_folder(temp):
        attempts.append(temp)
        if len(attempts) == 1:
            target.parent.mkdir(parents=True)  # the other worker, between the two looks
            raise FileNotFoundError(2, "No such file or directory", str(temp))
        temp.write_bytes(b"pixels")

    write_atomically(target, write_as_the_other_worker_makes_the_folder)

    assert target.read_bytes() == b"pixels"
    assert len(attempts) == 2
    assert [path.name for path in target.parent.iterdir()] == ["one.png"]


def test_many_writers_making_the_same_new_folders_at_once_all_succeed(tmp_path):
    # Threads released together write into shared folders none of them finds: whichever
    # makes a folder, every write lands and no temporary file is left.
    folders = [tmp_path / "images" / f"{shard:02x}" / "deeper" for shard in range(6)]
    start = threading.Barrier(12)
    failures = []

    def writer(number):
        start.wait()
        for round_ in range(5):
            target = folders[(number + round_) % len(folders)] / f"{number}-{round_}.png"
            try:
                write_atomically(target, lambda temp: temp.write_bytes(b"%d" % number))
            except OSError as error:
                failures.append(error)

    threads = [threading.Thread(target=writer, args=(number,)) for number in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert failures == []
    written = sorted(path.name for folder in folders for path in folder.iterdir())
    assert written == sorted(f"{n}-{r}.png" for n in range(12) for r in range(5))


def test_a_file_written_atomically_makes_its_missing_folders_and_leaves_nothing_on_failure(
    tmp_path,
):
    target = tmp_path / "a" / "b" / "c.bin"
    write_atomically(target, lambda temp: temp.write_bytes(b"first"))
    write_atomically(target, lambda temp: temp.write_bytes(b"second"))
    assert target.read_bytes() == b"second"
    assert [path.name for path in target.parent.iterdir()] == ["c.bin"]

    def fails_to_read(temp):
        temp.write_bytes(b"half")
        (tmp_path / "no such input").read_bytes()

    with pytest.raises(FileNotFoundError, match="no such input"):
        write_atomically(target, fails_to_read)
    with pytest.raises(FileNotFoundError, match="no such input"):
        write_atomically(tmp_path / "new" / "d.bin", fails_to_read)
    assert target.read_bytes() == b"second"
    assert [path.name for path in target.parent.iterdir()] == ["c.bin"]
    assert list((tmp_path / "new").iterdir()) == []
