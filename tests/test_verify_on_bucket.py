"""`verify` on an output root on object storage (the disk-backed S3 server) finds what it
finds on the local disk: the same partition built both ways, one resized PNG and one row of
the packed array damaged the same way in both, the same mismatches by path and problem, the
array read a few rows per range request.

Select with `pytest -m cluster`.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from cluster_services import AWS_ENVIRONMENT, BUCKET, S3_TESTS, Services, s3, start_s3_server
from fault_support import _ASSETS, STAGES
from test_sources_on_s3 import restart_forkserver

from radharmony_pipeline.defs.resources import pipeline_resources
from radharmony_pipeline.operations.verify import verify_outputs
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.packed_rows import read_layout
from radharmony_pipeline.processing.storage.store import output_path
from radharmony_pipeline.synthetic import generate_datasets

pytestmark = S3_TESTS

PARTITION = "chestx_det.test"
PREFIX = "verified"
DAMAGED_ROW = 1


@pytest.fixture(scope="module")
def built_both_ways(tmp_path_factory: pytest.TempPathFactory):
    """The partition's stages built on the local disk and on the bucket, each with its own
    instance: (local root, its instance, bucket URL, its instance, the server)."""
    logs = tmp_path_factory.mktemp("s3-logs")
    services = Services()
    patch = pytest.MonkeyPatch()
    try:
        start_s3_server(services, logs)
        for name, value in {**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": services.s3_endpoint}.items():
            patch.setenv(name, value)
        patch.delenv("RADHARMONY_DASK_SCHEDULER", raising=False)
        restart_forkserver()
        data = tmp_path_factory.mktemp("verify-sources") / "data"
        generate_datasets(data, scale="tiny", seed=7, mimic_format="mixed")
        local = tmp_path_factory.mktemp("verify-local") / "output"
        url = f"s3://{BUCKET}/{PREFIX}"
        built = []
        for root in (local, url):
            instance = dg.DagsterInstance.ephemeral()
            result = dg.materialize(
                _ASSETS,
                partition_key=PARTITION,
                resources=pipeline_resources(data, root),
                selection=STAGES.without_checks(),
                instance=instance,
            )
            assert result.success
            built += [root, instance]
        yield (*built, services)
    finally:
        patch.undo()
        restart_forkserver()
        services.stop()


def flipped(content: bytes, offset: int) -> bytes:
    damaged = bytearray(content)
    damaged[offset] ^= 0x5A
    return bytes(damaged)


def damage_on_disk(root: Path, name: str, offset: int) -> None:
    path = root / name
    path.write_bytes(flipped(path.read_bytes(), offset))


def damage_on_bucket(services: Services, name: str, offset: int) -> None:
    fs = s3(services)
    key = f"{BUCKET}/{PREFIX}/{name}"
    fs.pipe_file(key, flipped(fs.cat_file(key), offset))


def relative(found: list, root: object) -> set[tuple[str, str]]:
    return {(m.path.removeprefix(f"{root}/"), m.problem) for m in found}


@pytest.mark.timeout(600)
def test_verify_on_the_bucket_finds_what_it_finds_on_disk(built_both_ways):
    local, local_instance, url, bucket_instance, services = built_both_ways
    array = layout.packed_images(PARTITION)
    png = sorted(
        p.relative_to(local).as_posix()
        for p in local.glob(layout.resized_png_glob(PARTITION))
        if not p.name.endswith(".mask.png")
    )[0]
    packed = read_layout(local / array)
    assert packed.rows > 2 * DAMAGED_ROW
    row_byte = packed.data_offset + DAMAGED_ROW * packed.row_bytes + packed.row_bytes // 2
    # Two rows per read: the array is read in several range requests, not in one.
    window = 2 * packed.row_bytes
    bucket = output_path(url)
    for root, instance in ((local, local_instance), (bucket, bucket_instance)):
        assert verify_outputs(root, [PARTITION], instance, window_bytes=window) == []

    png_size = (local / png).stat().st_size
    damage_on_disk(local, png, png_size // 2)
    damage_on_disk(local, array, row_byte)
    damage_on_bucket(services, png, png_size // 2)
    damage_on_bucket(services, array, row_byte)

    progress: list[tuple[int, int]] = []
    on_bucket = verify_outputs(
        bucket,
        [PARTITION],
        bucket_instance,
        on_progress=lambda *p: progress.append(p),
        window_bytes=window,
    )
    on_disk = verify_outputs(local, [PARTITION], local_instance, window_bytes=window)

    assert {path for path, _ in relative(on_disk, local)} == {png, array}
    assert relative(on_bucket, bucket) == relative(on_disk, local)
    assert progress and progress[-1][0] == progress[-1][1] > 0
