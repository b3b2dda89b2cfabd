"""Source datasets on object storage: the tiny synthetic datasets uploaded to a moto S3 server
(a separate process on loopback, stopped by its PID), read with RADHARMONY_DATA_ROOT=s3://…,
must give the outputs of a run from the local copy of the same files. Plus confinement of
object keys, and clear errors for a missing object or an unreachable store.

Source paths are recorded relative to the dataset's image folder (`image_path`,
`source_image_path`), so tables do not depend on where the datasets live; only messages
that name a file give its full location (a local path or an s3:// URL).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest
from cluster_services import AWS_ENVIRONMENT, BUCKET, S3_TESTS, Services, free_port, s3, start_moto
from deadline import within
from PIL import Image
from upath import UPath

from radharmony_pipeline.definitions import defs
from radharmony_pipeline.defs.assets.source_files import observe_partition, source_files
from radharmony_pipeline.defs.groups import PUBLISHING
from radharmony_pipeline.defs.resources import pipeline_resources
from radharmony_pipeline.processing.imaging import image_files
from radharmony_pipeline.processing.imaging.decode import DecodeError, decode_grayscale
from radharmony_pipeline.processing.imaging.image_files import (
    ImageFileError,
    confined,
    header_image_size,
)
from radharmony_pipeline.processing.imaging.tagged_png import INPUT_KEY_TAG
from radharmony_pipeline.processing.jobs.image_jobs import ImageJob
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.source_snapshot import compare
from radharmony_pipeline.processing.storage.source_store import (
    SourceStoreError,
    named_states,
    source_path,
)
from radharmony_pipeline.sources import DatasetLayoutError, SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets

pytestmark = S3_TESTS

# JSON + CSV + JPEG with RLE masks; JSON + PNG with polygons; CSV(.gz) + DICOM headers/pixels.
PARTITIONS = ["chexlocalize.val", "chestx_det.test", "ms_cxr.test"]
MANIFEST = dg.AssetSelection.assets("unified_manifest")
DEFINITIONS = [d for d in [*defs.assets, *defs.asset_checks] if d is not source_files]
PREFIX = "data"


def restart_forkserver() -> None:
    """The per-image pool forks its workers from a server process that keeps the environment
    of the moment it started (earlier in the test session); stop it, so that the next pool
    starts one with this module's AWS_* variables. A pipeline process has them from its start.
    """
    from multiprocessing import forkserver

    forkserver._forkserver._stop()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    """moto_server on loopback, with AWS_* pointing at it for this module."""
    services = Services()
    patch = pytest.MonkeyPatch()
    try:
        start_moto(services, tmp_path_factory.mktemp("moto-logs"))
        for name, value in {**AWS_ENVIRONMENT, "AWS_ENDPOINT_URL": services.s3_endpoint}.items():
            patch.setenv(name, value)
        patch.delenv("RADHARMONY_DASK_SCHEDULER", raising=False)
        patch.setenv("RADHARMONY_WORKERS", "2")
        restart_forkserver()
        yield services
    finally:
        patch.undo()
        restart_forkserver()
        services.stop()


@pytest.fixture(scope="module")
def datasets(store: Services, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny datasets on disk and the same files uploaded under s3://<bucket>/data."""
    local = tmp_path_factory.mktemp("s3-sources") / "data"
    generate_datasets(local, scale="tiny", seed=7, mimic_format="mixed")
    s3(store).put(f"{local}/", f"{BUCKET}/{PREFIX}/", recursive=True)
    return local, f"s3://{BUCKET}/{PREFIX}"


def materialize(data_root: str | Path, output: Path) -> list[dg.ExecuteInProcessResult]:
    """Every stage of PARTITIONS, then the manifest (assets only: the checks read outputs)."""
    instance = dg.DagsterInstance.ephemeral()
    stages = (
        dg.AssetSelection.all() - MANIFEST - dg.AssetSelection.groups(PUBLISHING)
    ).without_checks()
    runs = [
        dg.materialize(
            DEFINITIONS,
            partition_key=key,
            resources=pipeline_resources(data_root, output),
            selection=stages,
            instance=instance,
            raise_on_error=False,
        )
        for key in PARTITIONS
    ]
    runs.append(
        dg.materialize(
            DEFINITIONS,
            resources=pipeline_resources(data_root, output),
            selection=MANIFEST.without_checks(),
            instance=instance,
            raise_on_error=False,
        )
    )
    return runs


@pytest.fixture(scope="module")
def both_runs(datasets, tmp_path_factory: pytest.TempPathFactory):
    local, url = datasets
    from_store = tmp_path_factory.mktemp("from-s3")
    from_disk = tmp_path_factory.mktemp("from-disk")
    store_runs = materialize(url, from_store)
    disk_runs = materialize(local, from_disk)
    return from_store, store_runs, from_disk, disk_runs


def files_below(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def png_content(path: Path) -> tuple[np.ndarray, dict]:
    """Pixels and text tags; the input key is left out: it fingerprints the source by
    (size, mtime) on disk and (size, ETag) on a store, so it differs by design."""
    with Image.open(path) as image:
        tags = {k: v for k, v in image.info.items() if isinstance(v, str) and k != INPUT_KEY_TAG}
        return np.asarray(image), tags


def without_roots(frame: pd.DataFrame, roots: list[str]) -> pd.DataFrame:
    """String cells with the dataset roots replaced, so messages naming files compare."""
    frame = frame.copy()
    for column in frame.columns:
        if pd.api.types.is_string_dtype(frame[column]) or frame[column].dtype == object:
            values = frame[column]
            for root in roots:
                values = values.map(
                    lambda v, r=root: v.replace(r, "<root>") if isinstance(v, str) else v
                )
            frame[column] = values
    return frame


def test_every_stage_from_s3_equals_a_run_from_the_local_copy(both_runs, datasets):
    from_store, store_runs, from_disk, disk_runs = both_runs
    local, url = datasets
    assert all(run.success for run in disk_runs)
    assert [run.success for run in store_runs] == [True] * (len(PARTITIONS) + 1)
    names = files_below(from_disk)
    assert files_below(from_store) == names
    kinds = {name.rsplit(".", 1)[-1] for name in names}
    assert {"parquet", "png", "npy"} <= kinds
    compared = {"parquet": 0, "png": 0, "npy": 0}
    for name in sorted(names):
        mine, reference = from_store / name, from_disk / name
        if name.endswith(layout.PACKED_HEADERS_SUFFIX):
            # Input keys and file states differ by design; what the headers hold does not.
            own = ["input_key", "image_state", "mask_state"]
            pd.testing.assert_frame_equal(
                pd.read_parquet(mine).drop(columns=own),
                pd.read_parquet(reference).drop(columns=own),
            )
        elif name.endswith(".parquet"):
            pd.testing.assert_frame_equal(
                without_roots(pd.read_parquet(mine), [url]),
                without_roots(pd.read_parquet(reference), [str(local)]),
            )
        elif name.endswith(".png"):
            pixels, tags = png_content(mine)
            expected_pixels, expected_tags = png_content(reference)
            np.testing.assert_array_equal(pixels, expected_pixels, err_msg=name)
            assert tags == expected_tags, name
            if name.startswith(f"{layout.MASKS}/"):  # keyed by annotations only: identical files
                assert mine.read_bytes() == reference.read_bytes(), name
        elif name.endswith(".npy"):
            np.testing.assert_array_equal(np.load(mine), np.load(reference), err_msg=name)
        elif name.endswith(".keys.json"):
            assert len(json.loads(mine.read_text())) == len(json.loads(reference.read_text()))
            continue
        else:
            assert mine.read_bytes() == reference.read_bytes(), name
        compared[name.rsplit(".", 1)[-1]] += 1
    assert all(compared.values()), compared
    manifest = pd.read_parquet(from_store / layout.MANIFEST)
    assert set(manifest["dataset"]) == {"chexlocalize", "chestx_det", "ms_cxr"}
    assert manifest["source_image_path"].str.endswith(".dcm").any()
    # Relative to the image folder, never the store's URL or a local path.
    assert not manifest["source_image_path"].str.contains("://|^/", regex=True).any()


def test_a_rerun_from_s3_reuses_every_image(both_runs, datasets):
    from_store, _runs, _disk, _disk_runs = both_runs
    _local, url = datasets
    run = dg.materialize(
        DEFINITIONS,
        partition_key="chexlocalize.val",
        resources=pipeline_resources(url, from_store),
        selection=dg.AssetSelection.assets("images").without_checks(),
        instance=dg.DagsterInstance.ephemeral(),
    )
    (materialization,) = run.asset_materializations_for_node("images")
    assert materialization.metadata["decoded"].value == 0
    assert materialization.metadata["reused"].value == materialization.metadata["images"].value


def test_dask_workers_read_the_sources_from_s3_themselves(both_runs, datasets, tmp_path):
    """Worker processes of a Dask cluster get UPaths (URL + options) and make their own S3
    clients: the images step gives the same rows and packed array as the local run."""
    from distributed import Client, LocalCluster

    _store_output, _runs, from_disk, _disk_runs = both_runs
    _local, url = datasets
    partition = "chexlocalize.val"
    with (
        # Daemonic worker processes, as Dask starts them by default.
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setenv("RADHARMONY_DASK_SCHEDULER", cluster.scheduler_address)
        run = dg.materialize(
            DEFINITIONS,
            partition_key=partition,
            resources=pipeline_resources(url, tmp_path),
            selection=dg.AssetSelection.assets(
                "raw_index", "labels", "masks", "images"
            ).without_checks(),
            instance=dg.DagsterInstance.ephemeral(),
        )
        with Client(cluster) as client:
            executed = client.run(lambda dask_worker: dask_worker.state.executed_count)
    # The per-image chunks of masks and images ran in the workers' own processes.
    assert run.success and sum(executed.values()) > 0
    table = layout.table_path("images", partition)
    pd.testing.assert_frame_equal(
        pd.read_parquet(tmp_path / table), pd.read_parquet(from_disk / table)
    )
    packed = layout.packed_images(partition)
    np.testing.assert_array_equal(np.load(tmp_path / packed), np.load(from_disk / packed))


def test_observing_sources_on_s3_lists_etags_and_sees_a_replaced_image(store, datasets):
    local, url = datasets
    on_store = open_source("chestx_det", environ={"RADHARMONY_DATA_ROOT": url})
    on_disk = open_source("chestx_det", environ={"RADHARMONY_DATA_ROOT": str(local)})
    before = observe_partition(on_store, "test")
    reference = observe_partition(on_disk, "test")
    assert before.image_tree_problem is None
    assert set(before.images) == set(reference.images) and before.images
    assert set(before.annotations) == set(reference.annotations)
    assert all(value.startswith("etag:") for value in before.annotations.values())
    assert [size for size, _ in before.images.values()] == [
        size for size, _ in (reference.images[name] for name in before.images)
    ]
    assert observe_partition(on_store, "test").data_version() == before.data_version()

    name = sorted(before.images)[0]
    client = s3(store)
    key = f"{BUCKET}/{PREFIX}/chestx-det/test/{name}"
    original = client.cat_file(key)
    buffer = io.BytesIO()
    Image.new("L", (8, 8), 9).save(buffer, format="PNG")
    client.pipe_file(key, buffer.getvalue())
    try:
        on_store = open_source("chestx_det", environ={"RADHARMONY_DATA_ROOT": url})
        on_store.image_dir("test").fs.invalidate_cache()
        after = observe_partition(on_store, "test")
    finally:
        client.pipe_file(key, original)
    assert after.data_version() != before.data_version()
    assert compare(before.images, after.images).modified == [name]


# --- confinement of object keys -------------------------------------------------------------

ROOT = "s3://bucket/datasets/chestx-det/test"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (f"{ROOT}/../train/x.png", "'..' segment"),
        (f"{ROOT}/a/../../../../other/x.png", "'..' segment"),
        (f"{ROOT}//etc/passwd", "empty segment"),
        ("s3://bucket/datasets/chestx-det/x.png", "outside the image folder"),
        ("s3://bucket/datasets/chestx-det/test-extra/x.png", "outside the image folder"),
        ("s3://other-bucket/datasets/chestx-det/test/x.png", "outside the image folder"),
        ("s3://bucket/etc/passwd", "outside the image folder"),
    ],
)
def test_object_keys_outside_the_image_prefix_are_refused(path, reason):
    with pytest.raises(ImageFileError, match=reason) as raised:
        confined(UPath(path), UPath(ROOT))
    assert "the file was not read" in str(raised.value)


def test_an_absolute_path_joined_to_the_prefix_is_refused():
    root = UPath(ROOT)
    with pytest.raises(ImageFileError, match="empty segment"):
        confined(root / "/etc/passwd", root)


def test_a_local_file_is_not_inside_an_object_prefix(tmp_path):
    with pytest.raises(ImageFileError, match="not on the dataset's object store"):
        confined(tmp_path / "x.png", UPath(ROOT))


def test_keys_inside_the_prefix_are_accepted_unchanged():
    root = UPath(ROOT)
    for relative in ("x.png", "a/b/c.png", "a/./b.png"):
        assert confined(root / relative, root) == root / relative


def image_job(base: UPath, name: str, state: tuple[int, str] | None = None) -> ImageJob:
    """A job for the object `name` below the image folder `base`, writing nowhere useful."""
    return ImageJob(
        image_id=f"chestx_det/{name}",
        source_file=base / name,
        union_mask_file=None,
        output_root=Path("/nonexistent-output"),
        image_relative="images/x.png",
        mask_relative=None,
        size=32,
        resize="letterbox",
        row=0,
        source_root=base,
        source_state=state,
    )


def test_an_image_job_never_reads_an_escaping_key(store, datasets):
    local, url = datasets
    base = source_path(f"{url}/chestx-det/test")
    existing = sorted(p.name for p in (local / "chestx-det" / "train").iterdir())[0]
    escaping = base / ".." / "train" / existing
    row, pixels = image_job(base, f"../train/{existing}").run()
    assert pixels is None and row.status == "error"
    assert "'..' segment" in row.error and str(escaping) in row.error


def test_input_keys_from_one_listing_equal_the_per_object_keys(store, datasets, monkeypatch):
    _local, url = datasets
    base = source_path(f"{url}/chestx-det/test")
    names = sorted(path.name for path in base.iterdir())[:4]
    # Names the listing cannot hold: an escaping key and a missing object.
    names += ["../train/" + names[0], "no-such-image.png"]

    def key_or_error(job: ImageJob) -> str:
        try:
            return job.input_key()
        except (OSError, ValueError) as error:
            return type(error).__name__

    per_object = [key_or_error(image_job(base, name)) for name in names]
    listed = named_states(base, names)
    assert sorted(listed) == names[:4]
    # With the listing's states, no object is asked about again.
    requests = []
    monkeypatch.setattr(image_files, "file_state", lambda path: requests.append(path) or (0, ""))
    from_listing = [key_or_error(image_job(base, n, listed.get(n))) for n in names[:4]]
    assert requests == []
    assert from_listing == per_object[:4]
    assert len(set(from_listing)) == 4  # keys, one per image, not error names
    # Names absent from the listing fall back to the per-object path: confinement first,
    # then the object's own state.
    monkeypatch.undo()
    assert per_object[4:] == ["ImageFileError", "ObjectNotFound"]


# --- missing objects and unreachable stores -------------------------------------------------


def test_a_missing_image_object_is_an_error_naming_its_url(store, datasets):
    _local, url = datasets
    missing = source_path(f"{url}/chestx-det/test/no-such-image.png")
    with pytest.raises(DecodeError, match="file not found") as raised:
        decode_grayscale(missing, target_size=32)
    assert str(missing) in str(raised.value)
    with pytest.raises(ImageFileError, match="file not found"):
        header_image_size(source_path(f"{url}/chexlocalize/CheXpert/val/missing.jpg"))


def test_a_missing_dataset_prefix_names_the_url_and_the_variable(store):
    source = open_source("chestx_det", environ={"RADHARMONY_DATA_ROOT": f"s3://{BUCKET}/nothing"})
    with pytest.raises(DatasetLayoutError) as raised:
        source.read_split("test")
    message = str(raised.value)
    assert f"s3://{BUCKET}/nothing/chestx-det/ChestX_Det_test.json" in message
    assert "RADHARMONY_CHESTX_DET_ROOT" in message


@pytest.fixture
def no_kept_s3_clients():
    """s3fs keeps one filesystem per set of options for the process, its client bound to the
    endpoint of the moment it was made: one made by an earlier test (on this module's store)
    would answer here, and one made here (on a closed port) would answer the tests after."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.usefixtures("no_kept_s3_clients")
def test_an_unreachable_store_fails_fast_with_the_fix(monkeypatch):
    closed = f"http://127.0.0.1:{free_port()}"
    for name, value in AWS_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    root = f"s3://{BUCKET}/{PREFIX}"
    source = open_source("chexlocalize", SourceLocation(), {"RADHARMONY_DATA_ROOT": root})
    with within(30, "reading from an unreachable store"), pytest.raises(SourceStoreError) as raised:
        source.read_split("val")
    message = str(raised.value)
    assert closed in message and f"s3://{BUCKET}/{PREFIX}/chexlocalize" in message
    assert "AWS_ENDPOINT_URL" in message
    # Not a per-image error row: decoding stops the step instead.
    image = source_path(f"{root}/chexlocalize/CheXpert/val/patient1/study1/view1_frontal.jpg")
    with pytest.raises(SourceStoreError):
        decode_grayscale(image, target_size=32)
