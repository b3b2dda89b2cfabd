"""Benchmark: raw_index + labels for rexgradient.train on full-scale metadata vs a bare json.load.

Prints wall time and peak RSS of each, measured in fresh child processes in the same run, and
the ratio. Targets (issue 2): the two assets within 2x the bare json.load, peak RSS < 1.5 GiB.

The timed span is `dg.materialize` of the one step (read, both tables, Parquet writes, run
bookkeeping). The ephemeral DagsterInstance it runs in is created before the timer starts
(~0.5 s): that is Dagster start-up, paid once per process whatever the assets do, not their
work. Imports are likewise outside both timers.

    .venv/bin/python benchmarks/bench_index.py [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path


def _peak_rss_mib() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bare_json_load(path: str, queue: multiprocessing.Queue) -> None:
    start = time.perf_counter()
    with open(path, "rb") as handle:
        data = json.load(handle)
    elapsed = time.perf_counter() - start
    queue.put({"seconds": elapsed, "peak_rss_mib": _peak_rss_mib(), "studies": len(data)})


def materialize_index_and_labels(root: str, queue: multiprocessing.Queue) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import dagster as dg

    from radharmony_pipeline.defs.assets.index_and_labels import raw_index_and_labels
    from radharmony_pipeline.defs.resources import (
        DatasetsResource,
        SourceLocationConfig,
        pipeline_resources,
    )

    baseline_rss = _peak_rss_mib()
    with tempfile.TemporaryDirectory() as output:
        resources = {
            **pipeline_resources(output_root=output),
            "datasets": DatasetsResource(rexgradient=SourceLocationConfig(root=root)),
        }
        instance = dg.DagsterInstance.ephemeral()
        start = time.perf_counter()
        result = dg.materialize(
            [raw_index_and_labels],
            partition_key="rexgradient.train",
            resources=resources,
            instance=instance,
        )
        elapsed = time.perf_counter() - start
        rows = {
            e.materialization.asset_key.to_user_string(): int(
                e.materialization.metadata["dagster/row_count"].value
            )
            for e in result.get_asset_materialization_events()
        }
    queue.put(
        {
            "seconds": elapsed,
            "peak_rss_mib": _peak_rss_mib(),
            "import_rss_mib": baseline_rss,
            "rows": rows,
            "success": result.success,
        }
    )


def in_child(target, *args) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    outcome = queue.get()
    process.join()
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="existing full-scale ReXGradient root")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.root
        if root is None:
            from radharmony_pipeline.synthetic import write_full_scale_rexgradient_metadata

            start = time.perf_counter()
            root = write_full_scale_rexgradient_metadata(Path(scratch) / "data")
            print(f"generated full-scale metadata in {time.perf_counter() - start:.1f} s")
        (root / "deid_png").mkdir(exist_ok=True)
        train_json = root / "download" / "metadata" / "train_metadata_view_position.json"
        size_mib = train_json.stat().st_size / 2**20
        bare = in_child(bare_json_load, str(train_json))
        assets = in_child(materialize_index_and_labels, str(root))
    ratio = assets["seconds"] / bare["seconds"]
    print(f"train JSON: {size_mib:.0f} MiB, {bare['studies']} studies")
    print(
        f"bare json.load:          {bare['seconds']:6.2f} s   peak RSS "
        f"{bare['peak_rss_mib']:6.0f} MiB"
    )
    print(
        f"raw_index + labels:      {assets['seconds']:6.2f} s   peak RSS "
        f"{assets['peak_rss_mib']:6.0f} MiB (after imports {assets['import_rss_mib']:.0f} MiB)"
    )
    print(f"rows: {assets['rows']}  success: {assets['success']}")
    print(f"ratio assets / json.load: {ratio:.2f}x  (target <= 2.0x)")
    print(f"peak RSS under 1.5 GiB:   {assets['peak_rss_mib'] < 1536}")
    return 0 if assets["success"] else 1


if __name__ == "__main__":
    sys.exit(main())
