"""The Hugging Face and WebDataset exports read back with their own libraries equal the
manifest; they are incremental, atomic under kill -9 and reproducible; a tiny CNN trains from
each; MONAI records and the seed-compatible samples have the documented keys and shapes."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.assets.exports import MASK_CLASSES
from radharmony_pipeline.defs.jobs import EXPORTS_JOB
from radharmony_pipeline.processing.corpus.exports import (
    HUGGINGFACE_FOLDER,
    HUGGINGFACE_SPLITS,
    RECORD_COLUMNS,
    WEBDATASET_FOLDER,
    WEBDATASET_INDEX_NAME,
    export_samples,
    export_schema,
    huggingface_data_files,
    huggingface_features,
    read_shard_index,
    webdataset_shards,
    webdataset_urls,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.processing.tables.manifest import partition_manifest
from radharmony_pipeline.sources import SOURCE_TYPES, partition_keys
from radharmony_pipeline.vocabulary import LABEL_COLUMNS

pytestmark = pytest.mark.build

# Small shards, so every partition of the tiny corpus spans several.
SHARD_BYTES = 100_000
EXPORTS = ("huggingface_export", "webdataset_export")
SPLIT_OF = {name: split for split, name in HUGGINGFACE_SPLITS.items()}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    # Nothing may reach a hub at run time.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def run_exports(data_root: Path, output: Path, partitions=None, shard_bytes: int = SHARD_BYTES):
    """The exports job per partition; {partition: {asset: metadata values}}."""
    job = build_definitions(data_root, output).resolve_job_def(EXPORTS_JOB)
    config = {"ops": {name: {"config": {"max_shard_bytes": shard_bytes}} for name in EXPORTS}}
    found = {}
    for key in partitions or partition_keys():
        result = job.execute_in_process(partition_key=key, run_config=config)
        assert result.success, key
        found[key] = {
            event.asset_key.to_user_string(): {
                name: value.value for name, value in event.materialization.metadata.items()
            }
            for event in result.get_asset_materialization_events()
        }
    return found


@pytest.fixture(scope="module")
def exported(tiny_root, tiny_corpus, tmp_path_factory) -> Path:
    """A copy of the tiny corpus with both exports of every partition."""
    root = tmp_path_factory.mktemp("exported") / "output"
    shutil.copytree(tiny_corpus[0], root)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_DATASETS_OFFLINE", "1")
        run_exports(tiny_root, root)
    return root


@pytest.fixture
def exported_copy(exported, tmp_path) -> Path:
    copy = tmp_path / "output"
    shutil.copytree(exported, copy)
    return copy


def manifest_records(root: Path) -> list[dict]:
    """The manifest's rows as Python values (nulls None), in manifest order."""
    return pq.read_table(root / layout.MANIFEST).to_pylist()


def png_pixels(content: bytes | Path) -> np.ndarray:
    data = content.read_bytes() if isinstance(content, Path) else content
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def shard_files(root: Path) -> dict[str, bytes]:
    folder = root / layout.EXPORTS
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_huggingface_export_reads_back_as_the_manifest(exported, tmp_path):
    import datasets

    expected_features = huggingface_features(export_schema(MASK_CLASSES))
    records = manifest_records(exported)
    nulls = 0
    for dataset in sorted({r["dataset"] for r in records}):
        files = huggingface_data_files(exported, dataset)
        loaded = datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path))
        splits = {r["split"] for r in records if r["dataset"] == dataset}
        assert set(loaded) == {HUGGINGFACE_SPLITS[split] for split in splits}
        for split_name, table in loaded.items():
            assert table.features == expected_features
            expected = [
                r for r in records if r["dataset"] == dataset and r["split"] == SPLIT_OF[split_name]
            ]
            assert table["image_id"] == [r["image_id"] for r in expected]
            for row, record in zip(table, expected, strict=True):
                for column in RECORD_COLUMNS:
                    assert row[column] == record[column], (record["image_id"], column)
                nulls += sum(row[c] is None for c in LABEL_COLUMNS)
                assert_same_pictures(row, record, exported)
        configured = datasets.load_dataset(
            str(exported / HUGGINGFACE_FOLDER), dataset, cache_dir=str(tmp_path)
        )
        assert {k: v["image_id"] for k, v in configured.items()} == {
            k: v["image_id"] for k, v in loaded.items()
        }
        streamed = datasets.load_dataset("parquet", data_files=files, streaming=True)
        for split_name, stream in streamed.items():
            ids = [row["image_id"] for row in stream]
            assert ids == loaded[split_name]["image_id"]
            assert stream.features == expected_features
    assert nulls > 0  # not-annotated labels stay null rather than becoming 0


def assert_same_pictures(row: dict, record: dict, root: Path) -> None:
    image = np.asarray(row["image"])
    assert np.array_equal(image, png_pixels(root / record["image_path"]))
    if record["has_mask"]:
        union = png_pixels(root / record["mask_path"])
        assert np.array_equal(np.asarray(row["mask"]), union)
    else:
        assert row["mask"] is None
        union = np.zeros_like(image)
    combined = np.zeros_like(image)
    for name in MASK_CLASSES:
        assert row[f"has_{name}_mask"] == (name in record["mask_classes"]), name
        mask = row[f"{name}_mask"]
        assert (mask is None) == (not row[f"has_{name}_mask"])
        if mask is not None:
            pixels = np.asarray(mask)
            assert pixels.shape == image.shape and set(np.unique(pixels)) <= {0, 255}
            combined |= pixels
    if record["mask_classes"]:
        # Nearest-neighbour resizing commutes with the union: the class masks rebuild it.
        assert np.array_equal(combined, union)


def test_webdataset_export_reads_back_as_the_manifest(exported):
    import webdataset as wds

    records = manifest_records(exported)
    for partition in partition_keys():
        dataset, split = partition.split(".")
        expected = [r for r in records if r["dataset"] == dataset and r["split"] == split]
        urls = webdataset_urls(exported, partition)
        samples = list(wds.WebDataset(urls, shardshuffle=False).decode())
        assert [s["json"]["image_id"] for s in samples] == [r["image_id"] for r in expected]
        for sample, record in zip(samples, expected, strict=True):
            assert sample["png"] == (exported / record["image_path"]).read_bytes()
            if record["has_mask"]:
                assert sample["mask.png"] == (exported / record["mask_path"]).read_bytes()
            else:
                assert "mask.png" not in sample
            for column in RECORD_COLUMNS:
                value = sample["json"][column]
                if isinstance(record[column], datetime):
                    value = datetime.fromisoformat(value)
                assert value == record[column], (record["image_id"], column)
        decoded = next(iter(wds.WebDataset(urls, shardshuffle=False).decode("l8")))
        assert np.array_equal(decoded["png"], png_pixels(exported / expected[0]["image_path"]))
        index = read_shard_index(exported / WEBDATASET_FOLDER / partition / WEBDATASET_INDEX_NAME)
        listed = [s["image_id"] for shard in index["shards"] for s in shard["samples"]]
        assert listed == [r["image_id"] for r in expected]
        assert index["samples"] == len(expected)
        payload = {r["image_id"]: len(sample_bytes(r, exported)) for r in expected}
        assert (len(index["shards"]) > 1) == (sum(payload.values()) > SHARD_BYTES)
        for shard in index["shards"]:
            size = sum(payload[s["image_id"]] for s in shard["samples"])
            assert size <= SHARD_BYTES or len(shard["samples"]) == 1


def sample_bytes(record: dict, root: Path) -> bytes:
    """What a WebDataset sample holds besides its JSON: the image and mask PNGs."""
    mask = (root / record["mask_path"]).read_bytes() if record["has_mask"] else b""
    return (root / record["image_path"]).read_bytes() + mask


def test_a_changed_partition_re_exports_only_its_shards(tiny_root, exported_copy):
    before = file_times(exported_copy / layout.EXPORTS)
    changed = "chestx_det.test"
    labels_file = layout.table_file(exported_copy, "labels", changed)
    table = pq.read_table(labels_file)
    frame = table.to_pandas()
    first = frame.index[0]
    frame.loc[first, "label_nodule"] = 1 - int(frame.loc[first, "label_nodule"])
    pq.write_table(type(table).from_pandas(frame, schema=table.schema), labels_file)

    found = run_exports(tiny_root, exported_copy)

    for partition, assets in found.items():
        for asset, metadata in assets.items():
            assert metadata["reused"] == (partition != changed), (partition, asset)
    after = file_times(exported_copy / layout.EXPORTS)
    rewritten = {p.relative_to(exported_copy).as_posix() for p in after if after[p] != before[p]}
    assert rewritten == {
        *(f"{WEBDATASET_FOLDER}/{changed}/{n}" for n in found_names(found, changed, 1)),
        f"{WEBDATASET_FOLDER}/{changed}/{WEBDATASET_INDEX_NAME}",
        *(f"{HUGGINGFACE_FOLDER}/chestx_det/{n}" for n in found_names(found, changed, 0)),
        f"{HUGGINGFACE_FOLDER}/chestx_det/test.index.json",
    }
    record = next(
        r
        for shard in sorted((exported_copy / HUGGINGFACE_FOLDER / "chestx_det").glob("test-*"))
        for r in pq.read_table(shard).to_pylist()
        if r["image_id"] == frame.loc[first, "image_id"]
    )
    assert record["label_nodule"] == frame.loc[first, "label_nodule"]


def file_times(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def found_names(found: dict, partition: str, which: int) -> list[str]:
    return found[partition][EXPORTS[which]]["shard_names"]


KILLED_EXPORT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from radharmony_pipeline.definitions import build_definitions
    from radharmony_pipeline.processing.corpus import exports
    from radharmony_pipeline.processing.storage.store import publish

    published = []

    def slow_publish_bytes(path, content):
        def half_then_wait(handle):
            handle.write(content[: len(content) // 2])
            handle.flush()
            if path.name.endswith(".tar"):
                published.append(path.name)
                print("WRITING", path.name, flush=True)
                if len(published) >= 2:
                    time.sleep(600)
            handle.write(content[len(content) // 2 :])
        publish(path, half_then_wait)

    exports.publish_bytes = slow_publish_bytes
    data, output, partition, shard_bytes = sys.argv[1:]
    job = build_definitions(Path(data), Path(output)).resolve_job_def("exports")
    config = {"max_shard_bytes": int(shard_bytes)}
    job.execute_in_process(
        partition_key=partition,
        run_config={"ops": {"webdataset_export": {"config": config}}},
        asset_selection=[__import__("dagster").AssetKey("webdataset_export")],
    )
    """
)


@pytest.mark.slow
def test_kill_9_during_an_export_then_a_rerun_gives_identical_shards(
    tiny_root, exported, exported_copy
):
    partition = "chestx_det.train"
    folder = exported_copy / WEBDATASET_FOLDER / partition
    reference = {
        p.name: p.read_bytes() for p in (exported / WEBDATASET_FOLDER / partition).iterdir()
    }
    shutil.rmtree(folder)
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLED_EXPORT,
            str(tiny_root),
            str(exported_copy),
            partition,
            str(SHARD_BYTES),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RADHARMONY_WORKERS": "1"},
    )
    try:
        writing = []
        while len(writing) < 2:
            line = process.stdout.readline()
            assert line, f"the export ended before its second shard: {writing}"
            if line.startswith("WRITING"):
                writing.append(line)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    names = webdataset_shards(partition)
    visible = {p.name: p.read_bytes() for p in folder.iterdir() if names.matches(p.name)}
    # The first shard was published whole; the second was being written when the process
    # died, and publishing buffers a file's bytes before its temporary is written, so nothing
    # of it is on disk at all.
    assert visible == {name: reference[name] for name in visible}
    assert len(visible) == 1
    assert {p.name for p in folder.iterdir()} == set(visible)

    run_exports(tiny_root, exported_copy, [partition])

    assert {p.name: p.read_bytes() for p in folder.iterdir()} == reference
    assert not [p for p in exported_copy.rglob(f"{TEMP_MARKER}*")]


def test_a_re_export_from_scratch_is_byte_identical(tiny_root, exported, exported_copy):
    shutil.rmtree(exported_copy / layout.EXPORTS)
    run_exports(tiny_root, exported_copy, ["ms_cxr.test", "chexlocalize.val"])
    reference = shard_files(exported)
    again = shard_files(exported_copy)
    assert again and all(again[name] == reference[name] for name in again)


class TinyNet:
    """A two-head CNN: per-pixel mask logits and 21 label logits."""

    def __init__(self):
        import torch

        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU())
        self.segment = torch.nn.Conv2d(4, 1, 1)
        self.classify = torch.nn.Linear(4, len(LABEL_COLUMNS))
        self.parameters = [
            *self.body.parameters(),
            *self.segment.parameters(),
            *self.classify.parameters(),
        ]

    def loss(self, img, mask, has_mask, labels):
        import torch

        features = self.body(img)
        per_image = torch.nn.functional.binary_cross_entropy_with_logits(
            self.segment(features), mask, reduction="none"
        ).mean(dim=(1, 2, 3))
        # Only annotated masks count: an unannotated image's zeros are not a negative mask.
        weights = has_mask.float()
        segmentation = (per_image * weights).sum() / weights.sum().clamp(min=1)
        known = ~labels.isnan()
        logits = self.classify(features.mean(dim=(2, 3)))
        classification = torch.nn.functional.binary_cross_entropy_with_logits(
            logits[known], labels[known].clamp(0, 1)
        ) if known.any() else logits.sum() * 0  # fmt: skip
        return segmentation + classification


def train_a_few_steps(loader, steps: int = 3) -> list[float]:
    import torch

    net = TinyNet()
    optimizer = torch.optim.SGD(net.parameters, lr=0.1)
    start = [p.detach().clone() for p in net.parameters]
    losses = []
    for batch, _ in zip(loader, range(steps), strict=False):
        optimizer.zero_grad()
        loss = net.loss(batch["img"], batch["mask"], batch["has_mask"], batch["labels"])
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert len(losses) == steps and all(np.isfinite(losses))
    assert any(not torch.equal(a, b) for a, b in zip(start, net.parameters, strict=True))
    return losses


def _tensors(pixels, mask_pixels, has_mask: bool, labels: list) -> dict:
    import torch

    img = torch.from_numpy(np.asarray(pixels, dtype=np.float32) / 127.5 - 1)[None]
    mask = (
        torch.from_numpy((np.asarray(mask_pixels) > 0).astype(np.float32))[None]
        if has_mask
        else torch.zeros_like(img)
    )
    values = [np.nan if v is None else float(v) for v in labels]
    return {"img": img, "mask": mask, "has_mask": has_mask, "labels": torch.tensor(values)}


def test_a_tiny_cnn_trains_from_each_export(exported, tmp_path):
    import datasets
    import webdataset as wds
    from torch.utils.data import DataLoader

    files = huggingface_data_files(exported, "chestx_det")
    table = datasets.load_dataset("parquet", data_files=files, cache_dir=str(tmp_path))["train"]

    def from_huggingface(batch):
        rows = [
            dict(zip(batch, values, strict=True)) for values in zip(*batch.values(), strict=True)
        ]
        tensors = [
            _tensors(r["image"], r["mask"], r["has_mask"], [r[c] for c in LABEL_COLUMNS])
            for r in rows
        ]
        return {key: [t[key] for t in tensors] for key in tensors[0]}

    huggingface = DataLoader(table.with_transform(from_huggingface), batch_size=2, shuffle=True)
    train_a_few_steps(huggingface)

    def from_webdataset(sample):
        record = sample["json"]
        return _tensors(
            sample["png"],
            sample.get("mask.png"),
            record["has_mask"],
            [record[c] for c in LABEL_COLUMNS],
        )

    urls = webdataset_urls(exported, "chestx_det.train")
    stream = wds.WebDataset(urls, shardshuffle=False).decode("l8").map(from_webdataset)
    train_a_few_steps(DataLoader(stream, batch_size=2))


def test_monai_reads_the_manifest_records(exported):
    from monai.data import Dataset
    from monai.transforms import LoadImaged

    from radharmony_pipeline.loader import manifest_records as records_for_monai

    manifest = exported / layout.MANIFEST
    records = records_for_monai(manifest)
    expected = manifest_records(exported)
    assert [r["image_id"] for r in records] == [r["image_id"] for r in expected]
    assert any(r["has_mask"] for r in records) and not all(r["has_mask"] for r in records)
    loading = LoadImaged(keys=["image", "mask"], allow_missing_keys=True, ensure_channel_first=True)
    dataset = Dataset(records, transform=loading)
    for sample, record in zip(dataset, expected, strict=True):
        pixels = png_pixels(exported / record["image_path"])
        assert tuple(sample["image"].shape) == (1, *pixels.shape)
        # MONAI's PIL reader puts the width first: its array is the PNG's transpose.
        assert np.array_equal(np.asarray(sample["image"][0]).T, pixels)
        assert ("mask" in sample) == record["has_mask"]
        if record["has_mask"]:
            assert tuple(sample["mask"].shape) == (1, *pixels.shape)
        assert sample["bbox"] == record["bboxes_resized"]
        assert sample["bbox_labels"] == record["bbox_labels"]
        labels = [np.nan if record[c] is None else record[c] for c in LABEL_COLUMNS]
        np.testing.assert_array_equal(sample["label"], labels)


# `cls` lengths the seed library's pages give per dataset; ReXGradient has no labels.
SEED_CLS_LENGTHS = {"chexlocalize": 14, "ms_cxr": 8, "chestx_det": 13}


def test_the_seed_compatible_class_returns_the_seed_keys_and_shapes(exported):
    import torch

    from radharmony_pipeline.loader import SeedCompatibleDataset

    manifest = exported / layout.MANIFEST
    expected = manifest_records(exported)
    for dataset, source in SOURCE_TYPES.items():
        labelled = dataset in SEED_CLS_LENGTHS
        seed = SeedCompatibleDataset(
            manifest,
            dataset,
            output_cls=labelled,
            output_mask=True,
            output_report=True,
            output_bbox=True,
        ).get_datasets()
        rows = [r for r in expected if r["dataset"] == dataset]
        assert len(seed) == len(rows)
        keys = {"img", "report"}
        keys |= {"cls"} if labelled else set()
        keys |= {"mask"} if source.mask_classes else set()
        keys |= {"bbox", "bbox_labels"} if source.has_boxes else set()
        for position, row in enumerate(rows):
            sample = seed[position]
            assert set(sample) == keys, dataset
            size = png_pixels(exported / row["image_path"]).shape
            assert sample["img"].shape == (1, *size) and sample["img"].dtype == torch.float32
            assert float(sample["img"].min()) >= -1 and float(sample["img"].max()) <= 1
            if labelled:
                assert sample["cls"].shape == (SEED_CLS_LENGTHS[dataset],)
            if "mask" in keys:
                assert sample["mask"].shape == (1, *size)
                assert bool(sample["mask"].any()) <= row["has_mask"]
            if "bbox" in keys:
                np.testing.assert_allclose(
                    np.reshape(sample["bbox"], (-1, 4)),
                    np.reshape(row["bboxes_resized"], (-1, 4)),
                    atol=1e-6,
                )
                assert sample["bbox_labels"] == row["bbox_labels"]
            assert sample["report"] == row["report"]
        if not labelled:
            with pytest.raises(ValueError, match="no structured labels"):
                SeedCompatibleDataset(manifest, dataset, output_cls=True)
    unified = SeedCompatibleDataset(manifest, "ms_cxr", output_cls=True, labels="unified")
    assert unified[0]["cls"].shape == (len(LABEL_COLUMNS),)


def export_files(root: Path, folder: str) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in (root / folder).rglob("*") if p.is_file()}


@pytest.mark.timeout(600)
def test_verify_finds_damaged_shards_and_the_next_export_rewrites_exactly_them(
    tiny_root, exported, exported_copy
):
    from radharmony_pipeline.operations.verify import verify_outputs

    partition = "chestx_det.train"
    tar_folder = exported_copy / WEBDATASET_FOLDER / partition
    parquet_folder = exported_copy / HUGGINGFACE_FOLDER / "chestx_det"
    tars = sorted(tar_folder.glob("*.tar"))
    parquets = sorted(parquet_folder.glob("train-*.parquet"))
    assert len(tars) > 1 and len(parquets) > 1  # several shards, one damaged of each
    truncated, flipped = tars[1], parquets[0]
    truncated.write_bytes(truncated.read_bytes()[:-100])
    content = bytearray(flipped.read_bytes())
    content[len(content) // 2] ^= 0x5A
    flipped.write_bytes(bytes(content))
    untouched = {
        p: p.stat().st_mtime_ns for p in [*tars, *parquets] if p not in (truncated, flipped)
    }

    found = {Path(m.path): m.problem for m in verify_outputs(exported_copy, [partition], None)}
    assert set(found) == {truncated, flipped}, found
    assert "truncated" in found[truncated] and "SHA-256" in found[flipped]

    run_exports(tiny_root, exported_copy, [partition])
    for folder in (WEBDATASET_FOLDER, HUGGINGFACE_FOLDER):
        assert export_files(exported_copy, folder) == export_files(exported, folder)
    assert {p: p.stat().st_mtime_ns for p in untouched} == untouched  # only those rewritten
    assert verify_outputs(exported_copy, [partition], None) == []


def test_samples_built_a_slice_at_a_time_are_the_partitions_rows(tiny_corpus):
    root, partition = tiny_corpus[0], "chexlocalize.test"
    tables = {
        name: pd.read_parquet(layout.table_file(root, name, partition))
        for name in ("raw_index", "labels", "masks", "bboxes", "images", "report_labels")
    }
    rows, _ = partition_manifest(partition, *tables.values())
    samples = export_samples(rows, tables["images"], tables["masks"], root)
    one_by_one = [samples[n] for n in range(len(samples))]
    assert len(samples) == len(rows) > 3
    assert [s.record["image_id"] for s in one_by_one] == rows["image_id"].tolist()
    assert list(samples) == one_by_one  # iteration goes a slice at a time
    # Any window gives the same samples as single rows; the last one is also index -1.
    assert samples[1:4] == one_by_one[1:4] and samples[-1] == one_by_one[-1]
    assert samples[len(samples) - 2 : len(samples) + 5] == one_by_one[-2:]
    with pytest.raises(IndexError):
        samples[len(samples)]
    masked = [s for s in one_by_one if s.class_masks]
    assert masked and all(path.exists() for s in masked for path in s.class_masks.values())
    assert all(s.image.exists() and s.provenance[0] != "None" for s in one_by_one)
