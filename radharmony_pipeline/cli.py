"""The `radharmony` command: generate synthetic datasets, run the demo, print a summary."""

from __future__ import annotations

import argparse
import os
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
        type=Path,
        default=None,
        help=f"datasets folder (default RADHARMONY_DATA_ROOT or {DEMO_DATA_ROOT})",
    )
    demo.set_defaults(run=_demo)

    args = parser.parse_args(argv)
    return args.run(args)


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
    data_root = args.data_root or Path(os.environ.get("RADHARMONY_DATA_ROOT") or DEMO_DATA_ROOT)
    os.environ["RADHARMONY_DATA_ROOT"] = str(data_root)
    os.environ.setdefault("DAGSTER_HOME", str(Path("dagster_home").resolve()))
    if not data_root.exists():
        from .synthetic import generate_datasets
        from .synthetic.duplicates import DEMO_DUPLICATES

        print(f"generating the demo datasets in {data_root} ...")
        generate_datasets(data_root, scale="small", seed=0, duplicates=DEMO_DUPLICATES)

    import dagster as dg

    from .definitions import defs
    from .defs.runner import (
        format_summary,
        materialize_manifest,
        materialize_partitions,
        observe_sources,
    )
    from .sources import partition_keys

    with dg.DagsterInstance.get() as instance:
        print("observing source files ...", flush=True)
        observe_sources(defs, instance)
        print("materializing every asset of every partition ...", flush=True)
        outcomes = materialize_partitions(
            defs,
            instance,
            partition_keys(),
            on_done=lambda o: print(
                f"  {o.partition:<20} {'ok' if o.success else 'FAILED'}", flush=True
            ),
        )
        print("joining the unified manifest ...", flush=True)
        outcomes.append(materialize_manifest(defs, instance))
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


if __name__ == "__main__":
    sys.exit(main())
