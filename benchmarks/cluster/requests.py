"""bench_cluster.py's `requests` section: the S3 requests of the `images` step on the cluster
path. The synthetic datasets at a scale on the disk-backed S3 server, outputs on `s3://`,
sources local, per-image work on a local `dask scheduler` with 2 single-threaded `dask worker`
processes. Each partition's upstream stages are built first; then the `images` step alone,
twice (a first build, a re-run with nothing changed), whose requests the server counts: per
image, by kind and by what they were for. Target: <= 3 per image."""

from __future__ import annotations

import os
import re
import tempfile
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common import Table

from cluster.services import S3_BUCKET, S3Server, s3_environment, start_dask_cli, start_s3_server
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.settings import SCHEDULER_VARIABLE
from radharmony_pipeline.synthetic import generate_datasets

REQUESTS_TARGET = 3  # S3 requests per image in the `images` step (issue 60)
REQUEST_PARTITIONS = ("rexgradient.train", "chestx_det.train")
PURPOSES = ("per image", "shards", "step")
RUNS = ("first build", "re-run, nothing changed")
# `.partial-<pid>@<host>-<32 hex>-<name>` (atomic.temporary_sibling); a shard's name.
TEMPORARY_NAME = re.compile(rf"^{re.escape(TEMP_MARKER)}.*?-[0-9a-f]{{32}}-(.*)$")
SHARD_NAME = re.compile(r"^shard\d+-")


def request_purpose(path: str) -> str:
    """What a request was for, from the object's path: the image's own objects (its PNGs,
    under their names or temporary ones), a Dask chunk's shard, or the step's own (tables,
    the packed array, listings)."""
    name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
    temporary = TEMPORARY_NAME.match(name)
    if temporary is not None:
        name = temporary.group(1)
        if SHARD_NAME.match(name):
            return "shards"
    return "per image" if name.endswith(".png") else "step"


@dataclass(frozen=True)
class StepRequests:
    """One `images` step: its images, wall seconds, and S3 requests by kind and purpose."""

    images: int
    seconds: float
    by_kind: Counter
    by_purpose: Counter

    def per_image(self) -> float:
        return sum(self.by_kind.values()) / self.images

    def line(self, name: str) -> str:
        total = sum(self.by_kind.values())
        kinds = ", ".join(f"{kind} {n / self.images:.2f}" for kind, n in self.by_kind.most_common())
        return (
            f"  {name}: {self.seconds:.1f} s, {total} S3 requests = "
            f"{self.per_image():.2f} per image (target <= {REQUESTS_TARGET})\n"
            f"    by kind, per image: {kinds}\n    by purpose, per image: {self.purposes()}"
        )

    def purposes(self) -> str:
        return ", ".join(
            f"{purpose} {self.by_purpose[purpose] / self.images:.2f}" for purpose in PURPOSES
        )

    def figures(self) -> dict:
        return {
            "images": self.images,
            "seconds": self.seconds,
            "by_kind": dict(self.by_kind),
            "by_purpose": dict(self.by_purpose),
        }


def images_step_requests(server: S3Server, data: Path, partition: str) -> list[StepRequests]:
    """The `images` step of `partition` alone (its upstream stages built first, uncounted),
    run twice: a first build, then a re-run with nothing changed."""
    import dagster as dg

    from radharmony_pipeline.defs.assets.images import images
    from radharmony_pipeline.defs.assets.index_and_labels import raw_index_and_labels
    from radharmony_pipeline.defs.assets.masks import masks
    from radharmony_pipeline.defs.resources import pipeline_resources

    resources = pipeline_resources(data_root=data, output_root=f"s3://{S3_BUCKET}/{partition}")
    stages = [raw_index_and_labels, masks, images]
    upstream = [dg.AssetKey(name) for name in ("raw_index", "labels", "masks")]
    built = dg.materialize(stages, partition_key=partition, resources=resources, selection=upstream)
    if not built.success:
        raise SystemExit(f"building the stages before `images` of {partition} failed")
    runs = []
    for _run in RUNS:
        server.stats()  # every earlier request's line is in the log once this answers
        offset = server.request_log.stat().st_size if server.request_log.exists() else 0
        start = time.perf_counter()
        result = dg.materialize(
            stages, partition_key=partition, resources=resources, selection=[dg.AssetKey("images")]
        )
        seconds = time.perf_counter() - start
        if not result.success:
            raise SystemExit(f"the `images` step of {partition} failed")
        server.stats()
        with open(server.request_log, "rb") as log:
            log.seek(offset)
            lines = [line.split() for line in log.read().decode().splitlines()]
        (materialization,) = result.asset_materializations_for_node("images")
        runs.append(
            StepRequests(
                images=int(materialization.metadata["images"].value),
                seconds=seconds,
                by_kind=Counter(fields[0] for fields in lines),
                by_purpose=Counter(request_purpose(fields[4]) for fields in lines),
            )
        )
    return runs


def requests_table(scale: str, steps: dict[str, list[StepRequests]]) -> Table:
    """Each partition's two runs as rows; figures["over"] names the partitions over target."""
    over = [p for p, runs in steps.items() if max(r.per_image() for r in runs) > REQUESTS_TARGET]
    rows = [
        [
            partition,
            run_name,
            step.images,
            f"{step.seconds:.1f} s",
            f"{step.per_image():.2f}",
            step.purposes(),
            f"≤ {REQUESTS_TARGET}",
        ]
        for partition, runs in steps.items()
        for run_name, step in zip(RUNS, runs, strict=True)
    ]
    columns = ["partition", "run", "images", "wall", "requests per image", "by purpose", "target"]
    note = (
        f"Synthetic datasets at scale {scale}; outputs on the disk-backed S3 server, per-image "
        "work on a local Dask scheduler with 2 single-threaded workers. By purpose: the image's "
        "own objects (PNGs), the Dask chunks' shards, the step's own (tables, the packed array, "
        "listings)."
    )
    figures = {
        "target": REQUESTS_TARGET,
        "over": over,
        "partitions": {
            partition: {name: step.figures() for name, step in zip(RUNS, runs, strict=True)}
            for partition, runs in steps.items()
        },
    }
    title = "S3 requests per image of the `images` step on the cluster path"
    return Table("cluster_requests", title, columns, rows, figures, note, "--section requests")


def requests_section(scale: str) -> Table:
    """Every partition of REQUEST_PARTITIONS measured (see the module's docstring); the table's
    figures["over"] lists those over REQUESTS_TARGET."""
    steps: dict[str, list[StepRequests]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_cluster_requests_") as scratch_name:
        scratch = Path(scratch_name)
        data = scratch / "data"
        generate_datasets(data, scale=scale, seed=0, datasets=["rexgradient", "chestx_det"])
        server = start_s3_server(scratch)
        dask = None
        try:
            # The Dask processes inherit the S3 variables: they write the step's objects.
            with s3_environment(server):
                dask = start_dask_cli(2, scratch / "dask-logs")
                os.environ[SCHEDULER_VARIABLE] = dask.address
                for partition in REQUEST_PARTITIONS:
                    steps[partition] = images_step_requests(server, data, partition)
                    first, rerun = steps[partition]
                    print(f"{partition}: {first.images} images", flush=True)
                    print(first.line(RUNS[0]))
                    print(rerun.line(RUNS[1]), flush=True)
        finally:
            os.environ.pop(SCHEDULER_VARIABLE, None)
            if dask is not None:
                dask.stop()
            server.stop()
    table = requests_table(scale, steps)
    if table.figures["over"]:
        print(f"over {REQUESTS_TARGET} requests per image: {', '.join(table.figures['over'])}")
    return table
