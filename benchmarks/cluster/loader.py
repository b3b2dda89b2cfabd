"""bench_cluster.py's `loader` section: training from the bucket. ManifestDataset's samples
per second over a shuffled pass, with 0, 2 and 4 DataLoader workers, reading ReXGradient's
train partition from a local output root and the same files on the disk-backed S3 server, the
two alternated in each round; and the bytes the server sent against the rows read (a
packed-array read is one row's range, never the whole array). The output root is a synthetic
one, or one a run left (a rehearsal's at the real size)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import SIZE, Table
from synthetic_outputs import write_images_partition

from cluster.services import S3_BUCKET, s3_environment, start_s3_server

PARTITION = "rexgradient.train"
DATASET, SPLIT = PARTITION.split(".")
WORKER_COUNTS = (0, 2, 4)
BATCH = 32
TARGET = 0.5  # the bucket's samples/s over the local disk's, with 4 workers


def write_training_root(root: Path, images: int) -> Path:
    """A train partition as the stages leave it (packed array, PNGs) and a manifest of its
    rows, every other column empty; the manifest's path. No row has a mask, as in ReXGradient
    train: a masked sample adds a request for its mask PNG."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from radharmony_pipeline.processing.storage import output_layout as layout
    from radharmony_pipeline.processing.tables.table_schemas import UNIFIED_MANIFEST

    write_images_partition(root, PARTITION, images, SIZE)
    rows = pd.read_parquet(layout.table_file(root, "images", PARTITION))
    dataset, split = PARTITION.split(".")
    given = {
        "image_id": rows["image_id"],
        "dataset": [dataset] * len(rows),
        "split": [split] * len(rows),
        "image_path": rows["image_path"],
        "has_mask": [False] * len(rows),
        "tensor_path": [layout.packed_images(PARTITION)] * len(rows),
        "tensor_index": rows["tensor_index"],
    }
    columns = {
        column.name: pa.array(given[column.name], type=column.type)
        if column.name in given
        else pa.nulls(len(rows), column.type)
        for column in UNIFIED_MANIFEST.columns
    }
    manifest = root / layout.MANIFEST
    manifest.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), manifest)
    return manifest


def upload_what_training_reads(root: Path, manifest: Path, url: str) -> int:
    """The manifest and PARTITION's packed array (what ManifestDataset reads), under `url`, at
    their paths relative to the root; the partition's rows."""
    import pandas as pd

    from radharmony_pipeline.processing.storage.store import output_path, publish_file

    table = pd.read_parquet(manifest, columns=["dataset", "split", "tensor_path"])
    train = table[(table["dataset"] == DATASET) & (table["split"] == SPLIT)]
    relative = {manifest.relative_to(root).as_posix(), *train["tensor_path"].dropna()}
    target = output_path(url)
    for name in sorted(relative):
        publish_file(target / name, root / name)
    return len(train)


# How a pass orders the samples, and the rows a read of the packed array takes: a plain
# shuffle reads each row alone; BlockShuffleSampler's order reads blocks of BLOCK_ROWS.
ORDERS = ("shuffled", "block-shuffled")
BLOCK_ROWS = 64


def samples_per_second(manifest: str, order: str, workers: int, samples: int, seed: int) -> float:
    """Samples per second of the first `samples` of a pass in `order`, in batches of BATCH,
    timed from the first batch (the workers' start-up is not training throughput)."""
    from torch.utils.data import DataLoader

    from radharmony_pipeline.loader import BlockShuffleSampler, ManifestDataset

    if order == "shuffled":
        dataset = ManifestDataset(manifest, datasets=DATASET, splits=SPLIT)
        positions = np.random.default_rng(seed).permutation(len(dataset))
    else:
        dataset = ManifestDataset(
            manifest, datasets=DATASET, splits=SPLIT, read_block_rows=BLOCK_ROWS
        )
        sampler = BlockShuffleSampler(dataset, seed=seed, batch_size=BATCH, num_workers=workers)
        positions = np.fromiter(sampler, dtype=np.int64)
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=positions[:samples].tolist(),
        num_workers=workers,
        collate_fn=stack_images,
    )
    batches = iter(loader)
    next(batches)
    start, counted = time.perf_counter(), 0
    for batch in batches:
        counted += len(batch)
    return counted / (time.perf_counter() - start)


def stack_images(samples: list[dict]) -> object:
    """The batch's images stacked (what a training step takes first); the rest dropped."""
    import torch

    return torch.stack([sample["img"] for sample in samples])


Rates = dict[tuple[str, str, int], list[float]]  # (order, place, workers) -> samples/s


def measure(places: dict[str, str], server: object, samples: int, rounds: int) -> tuple:
    """Every order, place and worker count in each round, the places alternated; the rates
    and the server's bytes sent per sample of each order and worker count."""
    rates: Rates = {}
    sent: dict[tuple[str, int], float] = {}
    for repeat in range(rounds):
        for order in ORDERS:
            for workers in WORKER_COUNTS:
                for place in list(places)[:: 1 if repeat % 2 == 0 else -1]:
                    before = server.stats()["bytes_out"]
                    rate = samples_per_second(places[place], order, workers, samples, repeat)
                    rates.setdefault((order, place, workers), []).append(rate)
                    if place == "bucket":
                        sent[order, workers] = (server.stats()["bytes_out"] - before) / samples
                    print(f"round {repeat + 1}, {order}, {workers} workers, {place}: {rate:6.0f}/s")
    return rates, sent


def loader_section(
    images: int, samples: int, rounds: int, training_root: Path | None = None
) -> Table:
    """The rates of every order and worker count on both places, from `training_root`'s
    manifest (an output root a run left) or else a synthetic partition of `images` rows; its
    other datasets and splits are not read."""
    from radharmony_pipeline.processing.storage import output_layout as layout

    folder = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    if training_root is None:
        root = folder / "output"
        manifest = write_training_root(root, images)
    else:
        root, manifest = training_root, training_root / layout.MANIFEST
    (folder / "s3").mkdir()
    server = start_s3_server(folder / "s3")
    try:
        with s3_environment(server):
            url = f"s3://{S3_BUCKET}/output"
            images = upload_what_training_reads(root, manifest, url)
            places = {"local disk": str(manifest), "bucket": f"{url}/{manifest.relative_to(root)}"}
            rates, sent = measure(places, server, samples, rounds)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    best = {key: max(runs) for key, runs in rates.items()}
    rows, ratios = [], {}
    for order in ORDERS:
        for workers in WORKER_COUNTS:
            local, bucket = best[order, "local disk", workers], best[order, "bucket", workers]
            ratios[f"{order}, {workers} workers"] = bucket / local
            rows.append(
                [
                    order,
                    str(workers),
                    f"{local:,.0f}",
                    f"{bucket:,.0f}",
                    f"{bucket / local:.2f}×",
                    f"{sent[order, workers] / 1024:.0f} KiB",
                ]
            )
    for order in ORDERS:
        ratio = ratios[f"{order}, 4 workers"]
        print(f"{order}: bucket / local disk with 4 workers {ratio:.2f}× (target ≥ {TARGET})")
    return Table(
        "cluster_loader",
        "Training from the bucket: ManifestDataset samples/s",
        ["order", "DataLoader workers", "local disk", "bucket", "bucket / local", "sent/sample"],
        rows,
        {
            "images": images,
            "samples": samples,
            "rates": {" | ".join(map(str, key)): runs for key, runs in rates.items()},
            "bucket_over_local": ratios,
        },
        f"Best of {rounds} rounds, {samples:,} samples in batches of {BATCH} from the "
        f"{images:,} rows of "
        + ("a synthetic " if training_root is None else "a run's ")
        + PARTITION
        + f"; block-shuffled: {BLOCK_ROWS}-row blocks.",
        "--section loader",
    )
