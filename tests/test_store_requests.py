"""What the output root costs in S3 requests, counted by the disk-backed server (s3rver behind
tests/s3_server.js): one request per publish, read, size lookup and page of a listing; a large
file uploaded in bounded parts and, on failure, aborted; and the `images` step on the cluster
path (Dask workers, outputs on the bucket) within 3 requests per image, with and without union
masks, its outputs those of a local run.

Select with `pytest -m cluster`.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from cluster_services import (
    AWS_ENVIRONMENT,
    BUCKET,
    S3_TESTS,
    Services,
    bucket_files,
    s3,
    s3_requests,
    start_dask,
    start_s3_server,
)
from fault_support import assert_same_outputs, output_files

from radharmony_pipeline.defs.previews import SAMPLES
from radharmony_pipeline.defs.resources import pipeline_resources
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage import store
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.processing.storage.retry_policy import ObjectStoreError
from radharmony_pipeline.processing.storage.source_store import read_source_bytes, source_path
from radharmony_pipeline.processing.storage.store import (
    file_size,
    listing,
    object_states,
    output_path,
    publish_bytes,
    publish_file,
    read_bytes,
    read_head,
    remove_orphaned_temporaries,
    single_put_state,
)
from radharmony_pipeline.settings import SCHEDULER_VARIABLE
from radharmony_pipeline.synthetic import generate_datasets
from radharmony_pipeline.vocabulary import UNION_CLASS

pytestmark = S3_TESTS

REQUESTS_PER_IMAGE = 3  # issue 60's target for the `images` step
PART = 5 * 2**20  # S3's smallest part but the last
# What the `images` step asks beside its images' own objects and the Dask chunks' shards:
# its input tables, the layout check, listings of the image folder, the array's size, the
# array, its keys and the table (15 on a first build of a small partition).
STEP_REQUESTS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """The disk-backed server, with AWS_* pointing at it for the module. s3fs keeps one client
    per set of options for the process, bound to the endpoint it was made for: none kept
    from before the module is used here, and none made here outlives it."""
    import s3fs

    logs = tmp_path_factory.mktemp("s3-logs")
    services = Services()
    patch = pytest.MonkeyPatch()
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        start_s3_server(services, logs, request_log=True)
        for name, value in {**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": services.s3_endpoint}.items():
            patch.setenv(name, value)
        yield services, logs / "s3-requests.log"
    finally:
        patch.undo()
        services.stop()
        s3fs.S3FileSystem.clear_instance_cache()


def counted(services: Services, action) -> dict[str, int]:
    """The requests `action()` made, by kind."""
    before = s3_requests(services)["requests"]
    action()
    after = s3_requests(services)["requests"]
    return {
        kind: after[kind] - before.get(kind, 0)
        for kind in after
        if after[kind] != before.get(kind, 0)
    }


def test_each_store_operation_is_one_request(server):
    services, _log = server
    root = output_path(f"s3://{BUCKET}/single")
    table = root / "tables" / "t.parquet"
    assert counted(services, lambda: publish_bytes(table, b"PAR1...PAR1")) == {"PUT": 1}
    assert counted(services, lambda: read_bytes(table)) == {"GET": 1}
    assert counted(services, lambda: read_head(table, 4)) == {"GET_RANGE": 1}
    assert counted(services, lambda: file_size(table)) == {"HEAD": 1}

    def read_missing() -> None:
        with pytest.raises(FileNotFoundError):
            read_bytes(root / "tables" / "missing.parquet")

    def size_missing() -> None:
        with pytest.raises(FileNotFoundError):
            file_size(root / "tables" / "missing.parquet")

    # No existence check before a read: a missing object is the GET's 404 (s3fs alone would
    # add a HEAD and a LIST).
    assert counted(services, read_missing) == {"GET": 1}
    assert counted(services, size_missing) == {"HEAD": 1}
    # A source image on the bucket likewise.
    source = source_path(f"s3://{BUCKET}/single/tables/t.parquet")
    assert counted(services, lambda: read_source_bytes(source)) == {"GET": 1}


def test_a_listing_is_one_request_per_1000_keys(server):
    services, _log = server
    client = s3(services)
    keys = {f"{BUCKET}/listed/{number % 7}/{number:05d}.png": b"x" for number in range(2001)}
    client.pipe(keys)
    found: set[str] = set()
    requests = counted(
        services, lambda: found.update(listing(output_path(f"s3://{BUCKET}/listed")))
    )
    assert len(found) == 2001
    assert requests == {"LIST": 3}
    states: dict[str, str] = {}
    requests = counted(
        services, lambda: states.update(object_states(output_path(f"s3://{BUCKET}/listed")))
    )
    assert requests == {"LIST": 3}
    assert set(states) == found
    # A key published by one PUT is listed with the state its bytes give (its ETag their MD5).
    assert set(states.values()) == {single_put_state(b"x")}
    # An empty folder is one request too (s3fs's own listing adds a HEAD and a LIST).
    requests = counted(
        services, lambda: states.update(object_states(output_path(f"s3://{BUCKET}/none")))
    )
    assert requests == {"LIST": 1}


def test_orphaned_temporaries_are_found_in_one_listing(server):
    services, _log = server
    client = s3(services)
    folder = output_path(f"s3://{BUCKET}/orphans")
    elsewhere = f"{TEMP_MARKER}1@another-host-{'0' * 32}-a.png"
    client.pipe(
        {
            f"{BUCKET}/orphans/0/a.png": b"kept",
            f"{BUCKET}/orphans/0/{TEMP_MARKER}a.png": b"an old writer's, without an owner",
            f"{BUCKET}/orphans/1/{elsewhere}": b"another host's: maybe live",
        }
    )
    removed: list = []
    requests = counted(services, lambda: removed.extend(remove_orphaned_temporaries(folder)))
    assert [path.name for path in removed] == [f"{TEMP_MARKER}a.png"]
    assert requests == {"LIST": 1, "DELETE": 1}
    # From a listing the caller took: no request but the deletions (none left to make).
    listed = object_states(folder)
    assert counted(services, lambda: remove_orphaned_temporaries(folder, listed=listed)) == {}
    assert sorted(object_states(folder)) == ["0/a.png", f"1/{elsewhere}"]


def test_a_large_file_is_uploaded_in_bounded_parts(server, tmp_path: Path, monkeypatch):
    services, _log = server
    monkeypatch.setattr(store, "MULTIPART_THRESHOLD", PART)
    monkeypatch.setattr(store, "PART_BYTES", PART)
    local = tmp_path / "array.npy"
    content = os.urandom(2 * PART + 1234)
    local.write_bytes(content)
    target = output_path(f"s3://{BUCKET}/parts/array.npy")
    requests = counted(services, lambda: publish_file(target, local))
    assert requests == {"MULTIPART_START": 1, "PART": 3, "MULTIPART_COMPLETE": 1}
    assert read_bytes(target) == content
    # Many parts would be needed: each grows so that S3's 10,000 parts hold the file.
    assert store.part_size(10_000 * PART + 1, PART) == PART + 1


def test_a_failed_multipart_upload_is_aborted_and_the_old_object_stays(
    server, tmp_path, monkeypatch
):
    services, _log = server
    monkeypatch.setattr(store, "MULTIPART_THRESHOLD", PART)
    monkeypatch.setattr(store, "PART_BYTES", PART)
    target = output_path(f"s3://{BUCKET}/aborted/array.npy")
    publish_bytes(target, b"the old array")
    local = tmp_path / "array.npy"
    local.write_bytes(os.urandom(3 * PART))
    fs = target.fs
    call = fs.call_s3

    def denied_second_part(method: str, *args, **kwargs):
        if method == "upload_part" and kwargs["PartNumber"] == 2:
            raise PermissionError("access denied to part 2")
        return call(method, *args, **kwargs)

    monkeypatch.setattr(fs, "call_s3", denied_second_part)
    requests: dict[str, int] = {}

    def upload() -> None:
        with pytest.raises(ObjectStoreError, match="upload part 2"):
            publish_file(target, local)

    requests = counted(services, upload)
    assert requests == {"MULTIPART_START": 1, "PART": 1, "MULTIPART_ABORT": 1}
    assert read_bytes(target) == b"the old array"


@pytest.fixture(scope="module")
def dask_on_the_bucket(server, tmp_path_factory: pytest.TempPathFactory):
    """Two single-threaded `dask worker` processes that reach the bucket, and the setting
    that sends the per-image work to them."""
    services, _log = server
    logs = tmp_path_factory.mktemp("dask-logs")
    dask = Services(s3_endpoint=services.s3_endpoint)
    patch = pytest.MonkeyPatch()
    try:
        start_dask(dask, logs, workers=2)
        patch.setenv(SCHEDULER_VARIABLE, dask.scheduler)
        yield dask
    finally:
        patch.undo()
        dask.stop()


class StageStep:
    """A partition's stages on the bucket, those before `stage` built first: run the step
    of `stage` alone and see the server's log lines of its requests."""

    ORDER = ("raw_index", "labels", "masks", "images")

    def __init__(self, server, data: Path, partition: str, prefix: str, stage: str) -> None:
        from radharmony_pipeline.defs.assets.images import images
        from radharmony_pipeline.defs.assets.index_and_labels import raw_index_and_labels
        from radharmony_pipeline.defs.assets.masks import masks

        self.services, self.request_log = server
        self.partition, self.stage = partition, stage
        self.resources = pipeline_resources(data_root=data, output_root=f"s3://{BUCKET}/{prefix}")
        self.stages = [raw_index_and_labels, masks, images]
        upstream = [dg.AssetKey(name) for name in self.ORDER[: self.ORDER.index(stage)]]
        assert dg.materialize(
            self.stages, partition_key=partition, resources=self.resources, selection=upstream
        ).success

    def run(self) -> tuple[dg.ExecuteInProcessResult, list[list[str]]]:
        """The stage's step alone, and the server's log lines of its requests (each: kind,
        status, bytes in, bytes out, path)."""
        s3_requests(self.services)  # answered once every earlier request's line is logged
        offset = self.request_log.stat().st_size
        result = dg.materialize(
            self.stages,
            partition_key=self.partition,
            resources=self.resources,
            selection=[dg.AssetKey(self.stage)],
        )
        assert result.success
        s3_requests(self.services)
        with open(self.request_log, "rb") as log:
            log.seek(offset)
            return result, [line.split() for line in log.read().decode().splitlines()]


def decoded(result: dg.ExecuteInProcessResult) -> int:
    (materialization,) = result.asset_materializations_for_node("images")
    return materialization.metadata["decoded"].value


def on_pngs(lines: list[list[str]]) -> Counter:
    """The requests on the images' own objects (their PNGs, their union masks), by kind."""
    return Counter(fields[0] for fields in lines if fields[4].endswith(".png"))


def on_shards(lines: list[list[str]]) -> Counter:
    """The requests on the Dask chunks' shards, by kind."""
    return Counter(fields[0] for fields in lines if "-shard" in fields[4])


@pytest.mark.timeout(600)
def test_the_images_step_on_the_cluster_path_costs_at_most_3_requests_per_image(
    server, dask_on_the_bucket, tmp_path: Path
):
    """ReXGradient train at the small scale (50 images, no masks): each image is one PUT of
    its PNG on a first build (the step's listing says it is not there: nothing is probed) and
    one ranged GET of its header on a re-run; the Dask chunks' shards and the step's tables,
    array and listings add less than one request per image."""
    services, _log = server
    data = tmp_path / "data"
    generate_datasets(data, scale="small", seed=0, datasets=["rexgradient"])
    step = StageStep(server, data, "rexgradient.train", "steps", "images")

    first, lines = step.run()
    assert decoded(first) == 50
    assert on_pngs(lines) == {"PUT": 50}, on_pngs(lines)
    assert len(lines) <= REQUESTS_PER_IMAGE * 50, Counter(fields[0] for fields in lines)
    # Nothing was ever written under a temporary key but the Dask chunks' shards.
    temporary = {fields[4] for fields in lines if TEMP_MARKER in fields[4]}
    assert all("-shard" in path for path in temporary)
    assert not [key for key in s3(services).find(f"{BUCKET}/steps") if TEMP_MARKER in key]

    # Unchanged: each image's PNG header is read (one ranged GET), nothing is decoded.
    again, lines = step.run()
    assert decoded(again) == 0
    assert on_pngs(lines) == {"GET_RANGE": 50}, on_pngs(lines)
    assert len(lines) <= REQUESTS_PER_IMAGE * 50, Counter(fields[0] for fields in lines)


@pytest.mark.timeout(600)
def test_a_masked_partition_costs_at_most_3_requests_per_image_and_equals_a_local_run(
    server, dask_on_the_bucket, tmp_path: Path, monkeypatch
):
    """ChestX-Det train at the small scale (40 images, each with a union mask). A first build
    costs each image 3 requests, the least it can: one GET of its union mask (for both its
    key and its pixels) and one PUT each of its PNG and of its resized mask, neither probed
    first. The Dask chunks' shards (3 requests a chunk) and the step's own requests come on
    top, a number that does not grow with the images. An unchanged re-run costs each image 2:
    its union mask (for the key) and its PNG's header; the resized mask is not read, its
    listed ETag being the MD5 of what the job would write. The outputs are a local run's."""
    services, _log = server
    data = tmp_path / "data"
    generate_datasets(data, scale="small", seed=0, datasets=["chestx_det"])
    partition = "chestx_det.train"
    step = StageStep(server, data, partition, "masked", "images")

    first, lines = step.run()
    table = first.asset_value("images")
    images, masked = len(table), int(table["mask_path"].notna().sum())
    assert images == masked == decoded(first) == 40
    assert on_pngs(lines) == {"GET": masked, "PUT": images + masked}, on_pngs(lines)
    assert sum(on_pngs(lines).values()) <= REQUESTS_PER_IMAGE * images
    shards = on_shards(lines)
    assert shards == {"PUT": shards["PUT"], "GET": shards["PUT"], "DELETE": shards["PUT"]}
    step_own = len(lines) - sum(on_pngs(lines).values()) - shards.total()
    assert step_own <= STEP_REQUESTS, Counter(fields[0] for fields in lines)

    again, lines = step.run()
    assert decoded(again) == 0
    assert on_pngs(lines) == {"GET": masked, "GET_RANGE": images}, on_pngs(lines)
    assert len(lines) <= REQUESTS_PER_IMAGE * images, Counter(fields[0] for fields in lines)
    pd.testing.assert_frame_equal(again.asset_value("images"), table)

    # The same partition on a local root, on the local pool: the same files, the same bytes.
    monkeypatch.delenv(SCHEDULER_VARIABLE)
    local = tmp_path / "local"
    resources = pipeline_resources(data_root=data, output_root=local)
    assert dg.materialize(step.stages, partition_key=partition, resources=resources).success
    remote = bucket_files(services, "masked")
    expected = output_files(local)  # but the local header record (mtimes and inodes)
    assert any(name.endswith(layout.UNION_MASK_SUFFIX) for name in expected)
    assert_same_outputs(remote, expected)


@pytest.mark.timeout(600)
def test_the_masks_step_reads_no_mask_on_a_first_build_and_one_header_each_on_a_rerun(
    server, dask_on_the_bucket, tmp_path: Path
):
    """ChestX-Det train at the small scale: a first build of `masks` PUTs each mask PNG
    (per class and the union) without reading it first (the step's listing says it is not
    there); run again unchanged (on a fresh instance: no table to re-use), it reads each
    mask's key once and writes none. Beside those, each reads the masks of the SAMPLES
    images its contact sheet draws."""
    data = tmp_path / "data"
    generate_datasets(data, scale="small", seed=0, datasets=["chestx_det"])
    step = StageStep(server, data, "chestx_det.train", "masks", "masks")

    first, lines = step.run()
    table = first.asset_value("masks").dropna(subset=["mask_path"])
    folder = f"/{layout.mask_folder(step.partition)}/"
    on_masks = Counter(fields[0] for fields in lines if folder in fields[4] and ".png" in fields[4])
    # Each mask PUT once, unread; the only reads are the class masks of the SAMPLES images
    # the contact sheet draws, whatever the partition's size.
    classes_per_image = table[table["mask_class"] != UNION_CLASS].groupby("image_id").size()
    assert on_masks["PUT"] == len(table) > 40
    assert on_masks["GET"] <= SAMPLES * classes_per_image.max(), on_masks
    assert set(on_masks) <= {"PUT", "GET"}, on_masks
    # The step's own (its tables, listings, the sheet) and the Dask chunks' shards' requests
    # do not grow with the masks.
    others = len(lines) - on_masks.total() - on_shards(lines).total()
    assert others <= STEP_REQUESTS, Counter(fields[0] for fields in lines)

    again, lines = step.run()
    on_masks = Counter(fields[0] for fields in lines if folder in fields[4] and ".png" in fields[4])
    assert set(on_masks) == {"GET"}
    assert len(table) <= on_masks["GET"] <= len(table) + SAMPLES * classes_per_image.max()
    pd.testing.assert_frame_equal(again.asset_value("masks"), first.asset_value("masks"))
