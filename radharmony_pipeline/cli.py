"""The `radharmony` command: generate synthetic datasets, run the demo, print a summary."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

DEMO_DATA_ROOT = Path("data/demo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radharmony", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    synth = commands.add_parser("synth", help="write faithful miniature datasets")
    synth.add_argument("--out", type=Path, required=True, help="folder to write the datasets in")
    synth.add_argument("--scale", choices=("tiny", "small"), default="tiny")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--dataset", action="append", help="only this dataset (repeatable)")
    synth.add_argument(
        "--mimic-format",
        choices=("jpg", "dcm", "mixed"),
        default="mixed",
        help="image format of the MIMIC-CXR tree under MS-CXR",
    )
    synth.add_argument(
        "--rexgradient-metadata-only",
        action="store_true",
        help="only ReXGradient metadata JSONs, no images (needs --full-scale)",
    )
    synth.add_argument(
        "--full-scale",
        action="store_true",
        help="with --rexgradient-metadata-only: the real study/image counts",
    )
    synth.set_defaults(run=_synth)

    demo = commands.add_parser(
        "demo", help="generate the demo datasets if missing, materialize everything, summarize"
    )
    demo.add_argument(
        "--data-root",
        default=None,
        help=f"datasets folder or s3:// URL (default RADHARMONY_DATA_ROOT or {DEMO_DATA_ROOT})",
    )
    demo.add_argument(
        "--partition",
        action="append",
        help="only this `<dataset>.<split>` partition (repeatable); the manifest is joined "
        "only when every partition is run",
    )
    demo.set_defaults(run=_demo)

    free = commands.add_parser(
        "free-slots",
        help="free the pool slots of runs whose process is gone (after a crash or kill -9)",
    )
    free.add_argument(
        "--run-id",
        action="append",
        default=[],
        help="also mark this run failed and free its slots, alive or not (repeatable)",
    )
    free.set_defaults(run=_free_slots)

    args = parser.parse_args(argv)
    from .processing.settings import ConfigurationError, validate_settings

    try:
        validate_settings()
    except ConfigurationError as error:
        print(f"radharmony: {error}", file=sys.stderr)
        return 2
    # Stop on SIGTERM as on Ctrl-C: Dagster marks the run failed, worker processes are killed,
    # temporary files are removed; a later run resumes.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("radharmony: interrupted", file=sys.stderr)
        return 130


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _synth(args: argparse.Namespace) -> int:
    from .synthetic import generate_datasets, write_full_scale_rexgradient_metadata

    if args.rexgradient_metadata_only != args.full_scale:
        print("--rexgradient-metadata-only and --full-scale go together", file=sys.stderr)
        return 2
    if args.full_scale:
        root = write_full_scale_rexgradient_metadata(args.out, seed=args.seed)
        print(f"wrote full-scale ReXGradient metadata under {root}")
        return 0
    roots = generate_datasets(
        args.out,
        scale=args.scale,
        seed=args.seed,
        datasets=args.dataset,
        mimic_format=args.mimic_format,
    )
    for dataset, root in roots.items():
        print(f"{dataset:<13} {root}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .processing.source_store import is_remote, source_path

    data_root = source_path(
        args.data_root or os.environ.get("RADHARMONY_DATA_ROOT") or DEMO_DATA_ROOT
    )
    os.environ["RADHARMONY_DATA_ROOT"] = str(data_root)
    os.environ.setdefault("DAGSTER_HOME", str(Path("dagster_home").resolve()))
    # Demo data is generated on disk only; datasets on a store are uploaded by the user.
    if not is_remote(data_root) and not data_root.exists():
        from .synthetic import generate_datasets
        from .synthetic.duplicates import DEMO_DUPLICATES

        print(f"generating the demo datasets in {data_root} ...")
        generate_datasets(
            data_root, scale="small", seed=0, duplicates=DEMO_DUPLICATES, parents=True
        )

    import dagster as dg

    from .defs.runner import (
        format_summary,
        materialize_manifest,
        materialize_partitions,
        observe_sources,
        project_location,
    )
    from .sources import partition_keys

    every_partition = partition_keys()
    chosen = args.partition or every_partition
    unknown = sorted(set(chosen) - set(every_partition))
    if unknown:
        print(f"unknown partition(s) {unknown}; known: {every_partition}", file=sys.stderr)
        return 2
    with dg.DagsterInstance.get() as instance, project_location(instance) as location:
        print("observing source files ...", flush=True)
        observe_sources(location, instance)
        print("materializing every asset of every partition ...", flush=True)
        outcomes = materialize_partitions(
            location,
            instance,
            chosen,
            on_done=lambda o: print(
                f"  {o.partition:<20} {'ok' if o.success else 'FAILED'}", flush=True
            ),
            say=lambda text: print(f"  {text}", flush=True),
        )
        if set(chosen) == set(every_partition):
            print("joining the unified manifest ...", flush=True)
            outcomes.append(materialize_manifest(location, instance))
    print()
    print(format_summary(outcomes))
    print()
    output = os.environ.get("RADHARMONY_OUTPUT_ROOT") or "data/output"
    print(
        f"Manifest: {output}/tables/unified_manifest.parquet (load it with "
        "radharmony_pipeline.loader.ManifestDataset)"
    )
    print(f"Tables: {output}/tables/   Images: {output}/images/   Previews: {output}/previews/")
    print("Open the UI with `make ui`, then http://127.0.0.1:3000 (same DAGSTER_HOME).")
    return 0 if all(o.success for o in outcomes) else 1


def _free_slots(args: argparse.Namespace) -> int:
    """What a user runs when the daemon (run monitoring) is not there to do it."""
    os.environ.setdefault("DAGSTER_HOME", str(Path("dagster_home").resolve()))
    import dagster as dg

    from .defs.recovery import free_slots_of_dead_runs, slot_holders

    with dg.DagsterInstance.get() as instance:
        for run_id in args.run_id:
            run = instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                instance.report_run_failed(run, message="marked failed by radharmony free-slots")
            instance.event_log_storage.free_concurrency_slots_for_run(run_id)
            print(f"freed the pool slots of run {run_id}")
        freed = free_slots_of_dead_runs(instance, print)
        remaining = slot_holders(instance)
    if not freed and not args.run_id:
        print("no run with a dead process holds a pool slot")
    for holder in remaining:
        print(f"still holding or waiting: {holder.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
