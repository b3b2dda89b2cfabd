"""Per-image outputs in shard folders: the bound on a folder's entries, every reader and the
loader following the layout, and an output root of the flat layout (every per-image file of a
partition in one folder) moved into shard folders without decoding anything again."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from commands import run_ok
from corpus import materialize_corpus

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.io_managers import TABLE_CHECKSUM
from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB, CARD_JOB, EXPORTS_JOB
from radharmony_pipeline.loader import ManifestDataset
from radharmony_pipeline.operations.migrate_layout import migrate_output_root
from radharmony_pipeline.operations.verify import recorded_table_checksums
from radharmony_pipeline.processing.corpus.card import CROISSANT_NAME, IMAGE_FILES
from radharmony_pipeline.processing.corpus.exports import HUGGINGFACE_FOLDER
from radharmony_pipeline.processing.storage import layout_migration
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.layout_migration import (
    LayoutMigrationError,
    migrate_stage_outputs,
    refuse_unfinished_migration,
    unfinished_migrations,
)

# A partition with masks (polygons) and one without, so the manifest holds other rows too.
PARTITIONS = ["chestx_det.test", "ms_cxr.test"]
FOLDER_LIMIT = 10_000
# The tables that record per-image paths, and their path columns (the flat layout's too).
PATH_COLUMNS = {
    "masks": ("mask_path",),
    "images": ("image_path", "mask_path"),
    "unified_manifest": ("image_path", "mask_path"),
    "near_duplicates": ("image_path",),
}


# --- the layout ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_million_images_fill_no_folder_beyond_ten_thousand_entries():
    keys = map("rexgradient__{:07d}".format, range(10**6))
    per_shard = Counter(map(layout.image_shard, keys))
    # The partition's folder holds the shards, each shard the images (and their union masks:
    # two files per image at most, still far below the bound).
    assert len(per_shard) == layout.SHARD_COUNT <= FOLDER_LIMIT
    assert 2 * max(per_shard.values()) <= FOLDER_LIMIT
    assert max(per_shard.values()) < 1.1 * 10**6 / layout.SHARD_COUNT  # evenly spread


def test_every_per_image_path_lies_in_its_images_shard():
    key = "chestx_det__36202"
    shard = layout.image_shard(key)
    assert layout.is_shard_name(shard) and not layout.is_shard_name(key)
    for path, folder in (
        (layout.resized_image("p.test", key), layout.resized_image_folder("p.test")),
        (layout.resized_union_mask("p.test", key), layout.resized_image_folder("p.test")),
        (layout.image_mask_folder("p.test", key) + "/any.png", layout.mask_folder("p.test")),
    ):
        assert path.startswith(f"{folder}/{shard}/{key}")
    assert Path("/out", layout.resized_image("p.test", key)).match(layout.resized_png_glob())
    assert Path("/out", layout.resized_union_mask("p.test", key)).match(
        layout.resized_png_glob("p.test")
    )
    mask = layout.image_mask_folder("p.test", key) + "/lung_opacity.png"
    assert Path("/out", mask).match(layout.mask_png_glob())


# --- an old-layout root, written by hand -------------------------------------------------

TOY = "toy.train"
OTHER = "other.test"


def flat_image(partition: str, key: str, suffix: str = ".png") -> str:
    """The flat layout of an image's resized PNG, as versions before sharding wrote it."""
    return f"images/{partition}/{key}{suffix}"


def flat_mask(partition: str, key: str, mask_class: str) -> str:
    return f"masks/{partition}/{key}/{mask_class}.png"


def write_table(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def write_flat_root(root: Path, keys: list[str]) -> dict[str, bytes]:
    """An output root of the flat layout with `keys` in TOY (every other one masked) and one
    image of OTHER in the manifest; the files' bytes by relative path."""
    files: dict[str, bytes] = {}
    masked = keys[::2]
    for key in keys:
        files[flat_image(TOY, key)] = f"png of {key}".encode()
    for key in masked:
        files[flat_image(TOY, key, ".mask.png")] = f"union of {key}".encode()
        for mask_class in ("any", "nodule"):
            files[flat_mask(TOY, key, mask_class)] = f"{mask_class} of {key}".encode()
    files[flat_image(OTHER, "other__1")] = b"png of other"
    for relative, content in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    union = [flat_image(TOY, k, ".mask.png") if k in masked else None for k in keys]
    images = pd.DataFrame(
        {"image_id": keys, "image_path": [flat_image(TOY, k) for k in keys], "mask_path": union}
    )
    write_table(root / layout.table_path("images", TOY), images)
    masks = pd.DataFrame(
        {
            "image_id": [k for k in masked for _ in range(2)],
            "mask_path": [flat_mask(TOY, k, c) for k in masked for c in ("any", "nodule")],
        }
    )
    write_table(root / layout.table_path("masks", TOY), masks)
    manifest = pd.concat(
        [
            images,
            pd.DataFrame({"image_id": ["other__1"], "image_path": [flat_image(OTHER, "other__1")]}),
        ]
    )
    write_table(root / layout.MANIFEST, manifest)
    write_table(
        root / layout.table_path("near_duplicates"), images.iloc[:2][["image_id", "image_path"]]
    )
    croissant = {
        "distribution": [
            {"@id": "unified_manifest_file", "contentUrl": layout.MANIFEST, "sha256": "old"},
            {"@id": "resized_images", "includes": "images/*/*.png"},
        ]
    }
    (root / CROISSANT_NAME).write_text(json.dumps(croissant))
    return files


def sharded(relative: str) -> str:
    """The test's own mapping of a flat path into its shard folder."""
    top, partition, entry, *rest = relative.split("/")
    key = entry.removesuffix(".png").removesuffix(".mask") if not rest else entry
    return "/".join([top, partition, layout.image_shard(key), entry, *rest])


def table_paths(root: Path, table: str, partition: str | None = None) -> list:
    frame = pd.read_parquet(root / layout.table_path(table, partition))
    return [v for c in PATH_COLUMNS[table] if c in frame for v in frame[c] if isinstance(v, str)]


def migrate_toy(root: Path) -> list[layout_migration.MigrationResult]:
    return [migrate_stage_outputs(root, stage, TOY) for stage in ("masks", "images")]


def test_a_flat_root_is_moved_into_shards_and_its_tables_follow(tmp_path):
    keys = [f"toy__{number:03d}" for number in range(40)]
    files = write_flat_root(tmp_path, keys)
    before = {r: os.stat(tmp_path / r).st_ino for r in files}

    masks, images = migrate_toy(tmp_path)

    assert (masks.moved, images.moved) == (20, 60)  # mask folders; images and union masks
    for relative, content in files.items():
        moved = relative if relative.startswith(f"images/{OTHER}/") else sharded(relative)
        assert (tmp_path / moved).read_bytes() == content
        assert os.stat(tmp_path / moved).st_ino == before[relative]  # renamed, not rewritten
    for folder in (layout.resized_image_folder(TOY), layout.mask_folder(TOY)):
        assert all(layout.is_shard_name(p.name) for p in (tmp_path / folder).iterdir())
    assert table_paths(tmp_path, "images", TOY) == [
        sharded(p)
        for p in [flat_image(TOY, k) for k in keys]
        + [flat_image(TOY, k, ".mask.png") for k in keys[::2]]
    ]
    assert all(tmp_path.joinpath(p).is_file() for p in table_paths(tmp_path, "masks", TOY))
    manifest = table_paths(tmp_path, "unified_manifest")
    assert flat_image(OTHER, "other__1") in manifest  # another partition's rows are left alone
    assert all(tmp_path.joinpath(p).is_file() for p in manifest)
    assert all(tmp_path.joinpath(p).is_file() for p in table_paths(tmp_path, "near_duplicates"))
    croissant = json.loads((tmp_path / CROISSANT_NAME).read_text())["distribution"]
    digest = hashlib.sha256((tmp_path / layout.MANIFEST).read_bytes()).hexdigest()
    assert croissant[0]["sha256"] == digest and croissant[1]["includes"] == IMAGE_FILES
    assert unfinished_migrations(tmp_path) == []

    again = migrate_toy(tmp_path)
    assert not any(result.changed for result in again)


def test_an_interrupted_migration_is_refused_until_a_rerun_finishes_it(tmp_path, monkeypatch):
    keys = [f"toy__{number:03d}" for number in range(10)]
    write_flat_root(tmp_path, keys)
    rewrite = layout_migration._rewrite_table

    def crash_at_the_manifest(root, recorded, outputs, partition):
        if recorded.table == "unified_manifest":
            raise KeyboardInterrupt  # killed between the images table and the manifest
        return rewrite(root, recorded, outputs, partition)

    monkeypatch.setattr(layout_migration, "_rewrite_table", crash_at_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        migrate_toy(tmp_path)
    assert unfinished_migrations(tmp_path) == [f"images/{TOY}"]
    with pytest.raises(LayoutMigrationError, match="migrate-layout"):
        refuse_unfinished_migration(tmp_path)
    manifest = pd.read_parquet(tmp_path / layout.MANIFEST)
    with pytest.raises(LayoutMigrationError, match="interrupted"):
        ManifestDataset(manifest, output_root=tmp_path)

    monkeypatch.setattr(layout_migration, "_rewrite_table", rewrite)
    masks, images = migrate_toy(tmp_path)
    assert not masks.changed  # finished before the crash
    assert images.resumed and images.moved == 0
    assert [t.table for t in images.rewritten] == ["unified_manifest", "near_duplicates"]
    assert unfinished_migrations(tmp_path) == []
    refuse_unfinished_migration(tmp_path)
    assert all(tmp_path.joinpath(p).is_file() for p in table_paths(tmp_path, "unified_manifest"))


def test_an_unexpected_state_is_refused_with_the_file_named(tmp_path):
    keys = ["toy__001", "toy__002"]
    write_flat_root(tmp_path, keys)
    twin = tmp_path / sharded(flat_image(TOY, keys[0]))
    twin.parent.mkdir(parents=True)
    twin.write_bytes(b"written by another run")
    with pytest.raises(LayoutMigrationError, match=r"both .* exist") as refused:
        migrate_stage_outputs(tmp_path, "images", TOY)
    assert str(twin) in str(refused.value)
    assert unfinished_migrations(tmp_path) == [f"images/{TOY}"]  # never read as complete
    twin.unlink()
    assert migrate_stage_outputs(tmp_path, "images", TOY).resumed

    other = tmp_path / "other"
    write_flat_root(other, keys)
    images = pd.read_parquet(other / layout.table_path("images", TOY))
    images.loc[1, "image_path"] = f"images/{TOY}/nested/{keys[1]}.png"
    write_table(other / layout.table_path("images", TOY), images)
    with pytest.raises(LayoutMigrationError, match="row 1, column image_path"):
        migrate_stage_outputs(other, "images", TOY)


@pytest.mark.slow
def test_the_cli_migrates_a_root_and_refuses_an_unexpected_state(tmp_path):
    output = tmp_path / "output"
    files = write_flat_root(output, ["toy__001", "toy__002"])
    (output / layout.resized_image_folder(TOY) / ".DS_Store").write_bytes(b"a file browser's")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    radharmony = Path(sys.executable).with_name("radharmony")
    # TOY is no registered dataset: named as the partition to migrate.
    command = [str(radharmony), "migrate-layout", "--output-root", str(output), "--partition", TOY]
    completed = run_ok(command, env=environment, timeout=300)
    assert "3 flat entries moved" in completed.stdout  # two images and one union mask
    assert "is in shard folders (4 moved)" in completed.stdout  # and one mask folder
    assert (output / layout.resized_image_folder(TOY) / ".DS_Store").exists()  # left alone
    # An old copy put back beside the moved file: which one is current cannot be told.
    stale = flat_image(TOY, "toy__002")
    (output / stale).write_bytes(files[stale])
    refused = subprocess.run(command, env=environment, capture_output=True, text=True)
    assert refused.returncode == 1
    assert str(output / stale) in refused.stderr and "Remove the one" in refused.stderr


# --- a built corpus -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tiny_root, tmp_path_factory):
    """PARTITIONS materialized with the manifest, the exports and the card; (root, instance)."""
    output = tmp_path_factory.mktemp("sharded") / "output"
    instance = dg.DagsterInstance.ephemeral()
    stages, manifest = materialize_corpus(tiny_root, output, PARTITIONS, instance=instance)
    assert manifest.success and all(result.success for result in stages.values())
    definitions = build_definitions(tiny_root, output)
    for partition in PARTITIONS:
        exported = definitions.resolve_job_def(EXPORTS_JOB).execute_in_process(
            partition_key=partition, instance=instance
        )
        assert exported.success
    assert definitions.resolve_job_def(CARD_JOB).execute_in_process(instance=instance).success
    return output, instance


def per_image_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for top in (layout.IMAGES, layout.MASKS)
        for p in sorted((root / top).rglob("*.png"))
    }


@pytest.mark.build
def test_every_reader_and_the_loader_follow_the_sharded_layout(built):
    output, _ = built
    manifest = pd.read_parquet(output / layout.MANIFEST)
    for partition in PARTITIONS:
        for folder in (layout.resized_image_folder(partition), layout.mask_folder(partition)):
            if (output / folder).exists():
                assert all(layout.is_shard_name(p.name) for p in (output / folder).iterdir())
        index = pd.read_parquet(output / layout.table_path("raw_index", partition))
        key_of = dict(zip(index["image_id"], index["image_key"], strict=True))
        rows = manifest[manifest["dataset"] + "." + manifest["split"] == partition]
        assert len(rows)
        for image_id, image_path in zip(rows["image_id"], rows["image_path"], strict=True):
            assert image_path == layout.resized_image(partition, key_of[image_id])
        masks = pd.read_parquet(output / layout.table_path("masks", partition))
        for image_id, path in zip(masks["image_id"], masks["mask_path"], strict=True):
            if isinstance(path, str):
                assert path.startswith(layout.image_mask_folder(partition, key_of[image_id]) + "/")

    # The loader reads the files the manifest names, which equal the packed rows.
    from_files = ManifestDataset(output / layout.MANIFEST, use_packed=False)
    from_arrays = ManifestDataset(output / layout.MANIFEST)
    masked = [i for i, has in enumerate(from_files.table["has_mask"]) if has]
    assert masked and len(from_files) == len(manifest)
    for index in [0, len(from_files) - 1, *masked[:3]]:
        sample = from_files[index]
        np.testing.assert_array_equal(
            np.asarray(sample["img"]), np.asarray(from_arrays[index]["img"])
        )
    assert any(np.asarray(from_files[i]["mask"]).any() for i in masked)

    # Croissant's file set lists exactly the resized PNGs the manifest names.
    croissant = json.loads((output / CROISSANT_NAME).read_text())
    (file_set,) = [d for d in croissant["distribution"] if d.get("includes")]
    listed = {p.relative_to(output).as_posix() for p in output.glob(file_set["includes"])}
    named = set(manifest["image_path"]) | set(manifest["mask_path"].dropna())
    assert listed == named

    # The Hugging Face export carries the images of the paths it records, byte for byte.
    shards = sorted((output / HUGGINGFACE_FOLDER / "chestx_det").glob("test-*.parquet"))
    exported = pd.concat(pd.read_parquet(shard) for shard in shards)
    assert len(exported) == (manifest["dataset"] == "chestx_det").sum()
    for image_path, image in zip(exported["image_path"], exported["image"], strict=True):
        assert (output / image_path).read_bytes() == image["bytes"]


def flatten(root: Path) -> None:
    """Turn a built root back into the flat layout of earlier versions: files moved out of
    their shard folders, path columns rewritten, Croissant's file set and manifest digest
    as the card wrote them then."""
    for partition in PARTITIONS:
        for folder in (layout.resized_image_folder(partition), layout.mask_folder(partition)):
            for shard in sorted((root / folder).glob("*")):
                for entry in sorted(shard.iterdir()):
                    entry.rename(root / folder / entry.name)
                shard.rmdir()
    for table, columns in PATH_COLUMNS.items():
        for path in sorted((root / layout.TABLES).glob(f"{table}/*.parquet")) or [
            root / layout.table_path(table)
        ]:
            frame = pq.read_table(path)
            for column in columns:
                values = [_flat(v) for v in frame.column(column).to_pylist()]
                index = frame.column_names.index(column)
                field = frame.schema.field(column)
                frame = frame.set_column(index, field, pa.array(values, field.type))
            pq.write_table(frame, path, write_page_checksum=True)
    document = json.loads((root / CROISSANT_NAME).read_text())
    for entry in document["distribution"]:
        if entry.get("includes"):
            entry["includes"] = "images/*/*.png"
        if entry.get("contentUrl") == layout.MANIFEST:
            entry["sha256"] = hashlib.sha256((root / layout.MANIFEST).read_bytes()).hexdigest()
    (root / CROISSANT_NAME).write_text(json.dumps(document))


def _flat(path: str | None) -> str | None:
    if path is None:
        return None
    top, partition, shard, *rest = path.split("/")
    assert layout.is_shard_name(shard), path
    return "/".join([top, partition, *rest])


def stage_metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict:
    (event,) = [
        e
        for e in result.get_asset_materialization_events()
        if e.materialization.asset_key == dg.AssetKey(asset)
    ]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def run_stages(data: Path, output: Path, instance: dg.DagsterInstance) -> dict[str, dict]:
    """Each partition's `all_stages`; per partition the images and masks steps' counts."""
    definitions = build_definitions(data, output)
    counts = {}
    for partition in PARTITIONS:
        result = definitions.resolve_job_def(ALL_STAGES_JOB).execute_in_process(
            partition_key=partition, instance=instance
        )
        assert result.success
        images, masks = stage_metadata(result, "images"), stage_metadata(result, "masks")
        counts[partition] = {
            "decoded": images["decoded"],
            "reused": images["reused"],
            "masks_written": masks["masks_written"],
        }
    return counts


@pytest.mark.build
def test_the_stages_move_a_flat_root_into_shards_and_decode_nothing(
    built, tiny_root, tmp_path, monkeypatch
):
    output, _ = built
    old = tmp_path / "old"
    shutil.copytree(output, old)
    flatten(old)
    assert set(map(_flat, per_image_files(output))) == set(per_image_files(old))
    monkeypatch.setenv("RADHARMONY_WORKERS", "1")

    first = run_stages(tiny_root, old, dg.DagsterInstance.ephemeral())

    images = {
        p: int((pd.read_parquet(output / layout.table_path("images", p))["status"] == "ok").sum())
        for p in PARTITIONS
    }
    assert first == {p: {"decoded": 0, "reused": images[p], "masks_written": 0} for p in PARTITIONS}
    assert per_image_files(old) == per_image_files(output)  # moved back, byte for byte
    for table in ("masks", "images"):
        for partition in PARTITIONS:
            pd.testing.assert_frame_equal(
                pd.read_parquet(old / layout.table_path(table, partition)),
                pd.read_parquet(output / layout.table_path(table, partition)),
            )
    for table in ("unified_manifest", "near_duplicates"):  # rewritten by the images steps
        pd.testing.assert_frame_equal(
            pd.read_parquet(old / layout.table_path(table)),
            pd.read_parquet(output / layout.table_path(table)),
        )
    document = json.loads((old / CROISSANT_NAME).read_text())
    assert json.dumps(document).count(IMAGE_FILES) == 1
    digest = hashlib.sha256((old / layout.MANIFEST).read_bytes()).hexdigest()
    assert digest in json.dumps(document)
    assert unfinished_migrations(old) == []

    again = run_stages(tiny_root, old, dg.DagsterInstance.ephemeral())
    assert all(c["decoded"] == 0 and c["masks_written"] == 0 for c in again.values())


@pytest.mark.build
def test_migrate_layout_records_the_rewritten_tables_checksums(built, tmp_path):
    output, _ = built
    old = tmp_path / "old"
    shutil.copytree(output, old)
    flatten(old)
    # What an earlier version's instance recorded: the flat tables' checksums.
    instance = dg.DagsterInstance.ephemeral()
    for partition in PARTITIONS:
        for table in ("masks", "images"):
            content = (old / layout.table_path(table, partition)).read_bytes()
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    table,
                    partition=partition,
                    metadata={TABLE_CHECKSUM: hashlib.sha256(content).hexdigest(), "rows": 1},
                )
            )
    messages: list[str] = []

    results = migrate_output_root(old, PARTITIONS, instance, messages.append)

    # Every resized PNG, and every image's mask folder (moved whole).
    assert sum(r.moved for r in results) == sum(
        len(list((output / layout.resized_image_folder(p)).glob("*/*.png")))
        + len(list((output / layout.mask_folder(p)).glob("*/*")))
        for p in PARTITIONS
    )
    assert per_image_files(old) == per_image_files(output)
    assert len(messages) == sum(r.changed for r in results) > 0
    for partition in PARTITIONS:
        recorded = recorded_table_checksums(instance, partition)
        for table in ("masks", "images"):
            content = (old / layout.table_path(table, partition)).read_bytes()
            assert recorded[table] == hashlib.sha256(content).hexdigest()
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("images"), asset_partitions=[partition]),
            limit=1,
        ).records
        assert record.asset_materialization.metadata["rows"].value == 1  # the rest kept
    manifest = ManifestDataset(old / layout.MANIFEST, use_packed=False)
    assert np.asarray(manifest[0]["img"]).any()
    assert not any(r.changed for r in migrate_output_root(old, PARTITIONS, None, print))


# --- object storage -----------------------------------------------------------------------


@pytest.mark.cluster
def test_a_flat_root_on_object_storage_moves_into_shard_keys(tmp_path, on_s3_server):
    from radharmony_pipeline.processing.storage.store import listing, output_path

    local = tmp_path / "local"
    keys = [f"toy__{number:03d}" for number in range(12)]
    files = write_flat_root(local, keys)
    root = output_path("s3://layout-test")
    root.fs.mkdir("layout-test")
    for path in sorted(local.rglob("*")):
        if path.is_file():
            root.fs.pipe_file(
                f"layout-test/{path.relative_to(local).as_posix()}", path.read_bytes()
            )
    # A move a crash left half done: copied, not yet deleted, under its journal.
    half = flat_image(TOY, keys[0])
    root.fs.pipe_file(f"layout-test/{sharded(half)}", files[half])
    journal = {"format": 1, "stage": "images", "partition": TOY, "shard_digits": 2}
    root.fs.pipe_file(
        f"layout-test/{layout.layout_migration_journal('images', TOY)}",
        json.dumps(journal).encode(),
    )

    masks, images = migrate_toy(root)

    root.fs.invalidate_cache()
    assert images.resumed and masks.moved == 6 and images.moved == 18
    stored = listing(root)
    for relative, content in files.items():
        moved = relative if relative.startswith(f"images/{OTHER}/") else sharded(relative)
        assert moved in stored and root.fs.cat_file(f"layout-test/{moved}") == content
        assert moved == relative or relative not in stored
    manifest = pd.read_parquet(io.BytesIO(root.fs.cat_file(f"layout-test/{layout.MANIFEST}")))
    assert set(manifest["image_path"]) <= stored
    assert unfinished_migrations(root) == []
