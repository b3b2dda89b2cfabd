"""The `radharmony` command: check the downloads, generate synthetic datasets, run the demo."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .settings import DATA_ROOT_VARIABLE, DEFAULT_DATA_ROOT

if TYPE_CHECKING:
    from .operations.runner import PartitionOutcome

DEMO_DATA_ROOT = Path(DEFAULT_DATA_ROOT)
# A user error (bad option, unknown dataset, missing path): one line, this exit status.
USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """Errors in one line naming the (sub)command, and where its help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class UserError(Exception):
    """A problem the user fixes (a missing path, a wrong option value); printed in one line."""


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's parser, and each subcommand's by name."""
    parser = _Parser(prog="radharmony", description=__doc__)
    parser.add_argument("--version", action="version", version=f"radharmony {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    subcommands = {}

    check = commands.add_parser(
        "check-data",
        help="check the downloads before a run: files, images, headers, counts, fixes",
        description="Resolve every dataset as the pipeline will and report, per partition, "
        "what was found and what to fix. Exit status 1 when a configured dataset is unusable.",
    )
    _add_check_data_arguments(check)
    subcommands["check-data"] = check

    synth = commands.add_parser("synth", help="write faithful miniature datasets")
    synth.add_argument("--out", type=Path, required=True, help="folder to write the datasets in")
    synth.add_argument(
        "--scale",
        choices=("tiny", "small"),
        default="tiny",
        help="tiny (tests, seconds) or small (the demo); default tiny",
    )
    synth.add_argument(
        "--seed", type=int, default=0, help="random seed; the same seed gives the same files"
    )
    synth.add_argument(
        "--dataset",
        action="append",
        choices=_dataset_keys(),
        help="only this dataset (repeatable)",
    )
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
    subcommands["synth"] = synth

    demo = commands.add_parser(
        "demo", help="generate the demo datasets if missing, materialize everything, summarize"
    )
    demo.add_argument(
        "--data-root",
        default=None,
        help=f"datasets folder or s3:// URL (default {DATA_ROOT_VARIABLE} or {DEMO_DATA_ROOT}); "
        f"must exist unless it is {DEMO_DATA_ROOT}, where the demo datasets are generated",
    )
    demo.add_argument(
        "--partition",
        action="append",
        help="only this `<dataset>.<split>` partition (repeatable); the manifest is joined "
        "only when every partition is run",
    )
    demo.set_defaults(run=_demo)
    subcommands["demo"] = demo

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
    subcommands["free-slots"] = free
    subcommands["verify"] = _add_verify(commands)
    subcommands["migrate-layout"] = _add_migrate_layout(commands)
    subcommands["label-reports"] = _add_label_reports(commands)
    return parser, subcommands


def main(argv: list[str] | None = None) -> int:
    parser, subcommands = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Reported by the subcommand, with its own usage, not the top-level one.
        subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    from .settings import ConfigurationError, validate_settings
    from .sources import SourceError

    try:
        validate_settings(os.environ)
    except ConfigurationError as error:
        print(f"radharmony: {error}", file=sys.stderr)
        return USAGE_ERROR
    # Stop on SIGTERM as on Ctrl-C: Dagster marks the run failed, worker processes are killed,
    # temporary files are removed; a later run resumes.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.run(args)
    except (UserError, SourceError, ConfigurationError) as error:
        print(f"radharmony {args.command}: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("radharmony: interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("radharmony-pipeline")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _dataset_keys() -> list[str]:
    from .sources import SOURCE_TYPES

    return list(SOURCE_TYPES)


def _add_check_data_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument(
        "--data-root",
        default=None,
        help=f"datasets folder or s3:// URL (default {DATA_ROOT_VARIABLE}); the per-dataset "
        "variables (RADHARMONY_CHESTX_DET_ROOT, ...) still apply",
    )
    check.add_argument(
        "--partition",
        action="append",
        help="only this `<dataset>.<split>` partition (repeatable); default all",
    )
    check.set_defaults(run=_check_data)


def _check_data(args: argparse.Namespace) -> int:
    from .processing.storage.source_store import exists, is_remote, source_path
    from .sources import partition_keys
    from .sources.location import expand_path

    if args.data_root:
        os.environ[DATA_ROOT_VARIABLE] = args.data_root
    given = os.environ.get(DATA_ROOT_VARIABLE)
    if given:
        root = source_path(expand_path(given, os.environ))
        if not is_remote(root) and not exists(root):
            raise UserError(
                f"data root {root} does not exist; set {DATA_ROOT_VARIABLE} (or --data-root) to "
                "the folder that holds the downloads"
            )
    unknown = sorted(set(args.partition or ()) - set(partition_keys()))
    if unknown:
        raise UserError(f"unknown partition(s) {', '.join(unknown)}; known: {partition_keys()}")
    from .defs.resources import DatasetsResource
    from .operations.data_check import any_unusable, check_partitions
    from .sources.location import data_root

    print(f"data root: {data_root(os.environ)}")
    reports = check_partitions(DatasetsResource(), args.partition)
    for report in reports:
        print("\n".join(report.lines()), flush=True)
    if all(report.status == "not configured" for report in reports):
        print(
            f"no dataset found: set {DATA_ROOT_VARIABLE} to the folder that holds the downloads, "
            "or a dataset's own variable",
            file=sys.stderr,
        )
        return 1
    if any_unusable(reports):
        print("some configured partitions are unusable; see the fixes above", file=sys.stderr)
        return 1
    print("every configured partition is usable")
    return 0


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
    from .processing.storage.source_store import is_remote, source_path
    from .sources import partition_keys
    from .sources.location import expand_path
    from .synthetic import generate_datasets, generated_partitions

    given = args.data_root or os.environ.get(DATA_ROOT_VARIABLE) or str(DEMO_DATA_ROOT)
    data_root = source_path(expand_path(given, os.environ))
    is_default = not is_remote(data_root) and data_root.resolve() == DEMO_DATA_ROOT.resolve()
    # The demo datasets are generated in their own folder only: a mistyped path must not
    # become a synthetic corpus where the user meant their download.
    if not is_remote(data_root) and not data_root.exists() and not is_default:
        raise UserError(
            f"data root {data_root} does not exist; point --data-root (or "
            f"{DATA_ROOT_VARIABLE}) at your datasets, or make synthetic ones there with "
            f"`radharmony synth --out {data_root}`"
        )
    unknown = sorted(set(args.partition or ()) - set(partition_keys()))
    if unknown:
        raise UserError(f"unknown partition(s) {', '.join(unknown)}; known: {partition_keys()}")
    os.environ[DATA_ROOT_VARIABLE] = str(data_root)
    os.environ.setdefault("DAGSTER_HOME", str(Path("dagster_home").resolve()))
    # Demo data is generated on disk only; datasets on a store are uploaded by the user.
    if is_default and not data_root.exists():
        from .synthetic.duplicates import DEMO_DUPLICATES

        print(f"generating the demo datasets in {data_root} ...")
        generate_datasets(
            data_root, scale="small", seed=0, duplicates=DEMO_DUPLICATES, parents=True
        )

    import dagster as dg

    from .defs.resources import default_output_root
    from .operations.runner import (
        format_summary,
        materialize_card,
        materialize_exports,
        materialize_manifest,
        materialize_partitions,
        observe_sources,
        project_location,
    )

    # On the demo's synthetic data, the datasets that have a generator (a registered dataset
    # without one has no demo data); on real data, every registered one.
    every_partition = generated_partitions() if is_default else partition_keys()
    chosen = args.partition or every_partition
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
        published = []
        if set(chosen) == set(every_partition):
            print("joining the unified manifest ...", flush=True)
            outcomes.append(materialize_manifest(location, instance))
            built = [o.partition for o in outcomes if o.success and o.partition in chosen]
            print("writing each partition's Hugging Face and WebDataset shards ...", flush=True)
            published = materialize_exports(
                location,
                instance,
                built,
                on_done=lambda o: print(
                    f"  {o.partition:<20} {'ok' if o.success else 'FAILED'}", flush=True
                ),
            )
            if outcomes[-1].success:
                print("writing the dataset card ...", flush=True)
                published.append(materialize_card(location, instance))
    print()
    print(format_summary(outcomes))
    print()
    print(_where_the_outputs_are(default_output_root(), outcomes, published))
    print("Open the UI with `make ui`, then http://127.0.0.1:3000 (same DAGSTER_HOME).")
    return 0 if all(o.success for o in outcomes + published) else 1


def _where_the_outputs_are(
    output: str, built: Sequence[PartitionOutcome], published: Sequence[PartitionOutcome]
) -> str:
    """Where each product of the demo is, for the lines after its summary."""
    from .processing.corpus.card import CARD_NAME, CROISSANT_NAME
    from .processing.storage import output_layout as layout

    lines = []
    manifest = next((o for o in built if o.partition == "unified_manifest"), None)
    if manifest is not None and manifest.success:
        lines.append(
            f"Manifest: {output}/{layout.MANIFEST} (load it with "
            "radharmony_pipeline.loader.ManifestDataset)"
        )
    else:
        lines.append("No manifest was joined (it needs every partition, each run successfully).")
    if any(o.success for o in built):
        lines.append(
            f"Tables: {output}/{layout.TABLES}/   Images: {output}/{layout.IMAGES}/   "
            f"Previews: {output}/{layout.PREVIEWS}/"
        )
    exported = [o for o in published if o.partition != "corpus_card"]
    if exported:
        failed = [o.partition for o in exported if not o.success]
        lines.append(
            f"Hugging Face shards: {output}/{layout.HUGGINGFACE_EXPORT}/   WebDataset shards: "
            f"{output}/{layout.WEBDATASET_EXPORT}/"
            + (f"   (not exported: {', '.join(failed)})" if failed else "")
        )
    card = next((o for o in published if o.partition == "corpus_card"), None)
    if card is not None and card.success:
        lines.append(f"Dataset card: {output}/{CARD_NAME}   Croissant: {output}/{CROISSANT_NAME}")
    elif card is not None:
        lines.append(f"The dataset card was not written: {card.error or 'a check failed'}")
    return "\n".join(lines)


def _free_slots(args: argparse.Namespace) -> int:
    """What a user runs when the daemon (run monitoring) is not there to do it."""
    os.environ.setdefault("DAGSTER_HOME", str(Path("dagster_home").resolve()))
    import dagster as dg

    from .internals import free_concurrency_slots, mark_run_failed
    from .operations.recovery import free_slots_of_dead_runs, slot_holders

    with dg.DagsterInstance.get() as instance:
        for run_id in args.run_id:
            run = instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                mark_run_failed(instance, run, "marked failed by radharmony free-slots")
            free_concurrency_slots(instance, run_id)
            print(f"freed the pool slots of run {run_id}")
        freed = free_slots_of_dead_runs(instance, print)
        remaining = slot_holders(instance)
    if not freed and not args.run_id:
        print("no run with a dead process holds a pool slot")
    for holder in remaining:
        print(f"still holding or waiting: {holder.describe()}")
    return 0


def _add_label_reports(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    command = commands.add_parser(
        "label-reports",
        help="label report texts of your own (CSV or Parquet) with the report labeler",
        description="Read every report of a CSV or Parquet file with the report labeler and "
        "write one row per input row, in order: the id column (when there is one), "
        "report_label_<observation> (1 positive, 0 negative, -1 uncertain, null not "
        "mentioned) and the evidence sentences. With --agreement, print the agreement with "
        "labels you hold for the same reports (docs/report-labels.md).",
    )
    command.add_argument("--input", type=Path, required=True, help="the reports: .csv or .parquet")
    command.add_argument("--text-column", required=True, help="the column holding the text")
    command.add_argument(
        "--output",
        type=Path,
        required=True,
        help="the labels: .parquet, or .csv (the evidence as JSON text)",
    )
    command.add_argument(
        "--agreement",
        type=Path,
        help="a CSV of labels for the same reports: the id column plus observation columns "
        "(CheXpert's names, e.g. `Pleural Effusion`, or ours) with 1, 0, -1 or blank",
    )
    command.add_argument(
        "--id-column",
        default="id",
        help="the column naming each report in --input and --agreement (default: id)",
    )
    command.set_defaults(run=_label_reports)
    return command


def _label_reports(args: argparse.Namespace) -> int:
    from .operations.label_reports import (
        ReaderWithProgress,
        ReportInputError,
        labelled_reports,
        output_format,
        paired_labels,
        read_table,
        reference_labels,
        require_column,
        write_labels,
    )

    def progress(done: int, total: int) -> None:
        print(f"labelled {done:,} of {total:,} distinct reports", file=sys.stderr, flush=True)

    try:
        output_format(args.output)
        reports = read_table(args.input)
        require_column(reports, args.text_column, args.input, "--text-column")
        reference = reference_labels(args.agreement, args.id_column) if args.agreement else None
        # Imported once the files are known good: spaCy takes seconds to import.
        from .processing.reports.labeler import ReportLabeler

        reader = ReaderWithProgress(ReportLabeler(), progress)
        labels = labelled_reports(reports, args.text_column, args.id_column, reader)
        pairs = paired_labels(labels, reference, args.id_column) if reference is not None else None
    except ReportInputError as error:
        raise UserError(str(error)) from error
    write_labels(labels, args.output)
    print(f"wrote report labels of {len(labels)} reports to {args.output}")
    if pairs is not None:
        from .processing.reports.agreement import agreement_scores, format_agreement

        print(f"agreement with {args.agreement} on {len(pairs[0])} reports:")
        print(format_agreement(agreement_scores(*pairs)))
    return 0


def _add_verify(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from .settings import SCHEDULER_VARIABLE, WORKERS_VARIABLE

    verify = commands.add_parser(
        "verify",
        help="check that every output still holds what was recorded when it was written; "
        "exit 1 on any mismatch",
        description="Check every output against its record, on the stages' executor: "
        f"{WORKERS_VARIABLE} local processes, or the Dask cluster at {SCHEDULER_VARIABLE}. "
        "Progress goes to stderr every few seconds; exit 1 on any mismatch.",
    )
    _add_output_arguments(verify)
    verify.set_defaults(run=_verify)
    return verify


def _verify(args: argparse.Namespace) -> int:
    """Table checksums come from the instance at DAGSTER_HOME, when there is one."""
    from .defs.run_settings import RunSettingsResource
    from .operations.verify import verify_outputs
    from .processing.execution.progress import ProgressLog

    # The stages' own run settings (workers, Dask scheduler) choose where files are checked.
    executor = RunSettingsResource().executor()
    progress = ProgressLog(_StderrLog("radharmony verify"), "outputs checked", 0)
    with _outputs_of(args) as (root, partitions, instance):
        mismatches = verify_outputs(root, partitions, instance, executor, progress.update)
    for mismatch in mismatches:
        print(mismatch)
    checked = ", ".join(partitions)
    if mismatches:
        print(
            f"radharmony verify: {len(mismatches)} damaged output(s) in {checked}; "
            "materialize those partitions again to repair them",
            file=sys.stderr,
        )
        return 1
    print(f"radharmony verify: every output of {checked} matches its record")
    return 0


class _StderrLog:
    """Progress lines on stderr, prefixed with the command (stdout keeps the mismatches)."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    def info(self, msg: str) -> None:
        print(f"{self._prefix}: {msg}", file=sys.stderr, flush=True)


def _add_migrate_layout(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    migrate = commands.add_parser(
        "migrate-layout",
        help="move an output root's per-image files into shard folders (renames, nothing "
        "decoded); the stages also do this for the partition they build",
    )
    _add_output_arguments(migrate)
    migrate.set_defaults(run=_migrate_layout)
    return migrate


def _migrate_layout(args: argparse.Namespace) -> int:
    """Rewritten tables' checksums go to the instance at DAGSTER_HOME, when there is one."""
    from .operations.migrate_layout import migrate_output_root
    from .processing.storage.layout_migration import LayoutMigrationError

    with _outputs_of(args) as (root, partitions, instance):
        try:
            results = migrate_output_root(root, partitions, instance, print)
        except LayoutMigrationError as error:
            print(f"radharmony migrate-layout: error: {error}", file=sys.stderr)
            return 1
    moved = sum(result.moved for result in results)
    print(f"radharmony migrate-layout: {root} is in shard folders ({moved:,} moved)")
    return 0


def _add_output_arguments(command: argparse.ArgumentParser) -> None:
    """The partitions and output root a command over existing outputs works on."""
    command.add_argument(
        "--partition", action="append", help="only this `<dataset>.<split>` (repeatable)"
    )
    command.add_argument(
        "--output-root",
        default=None,
        help="folder or s3:// URL of the outputs (default: the pipeline's output root)",
    )


@contextlib.contextmanager
def _outputs_of(args: argparse.Namespace) -> Iterator[tuple[Any, list[str], Any]]:
    """(output root, partitions, the instance at DAGSTER_HOME or None), the instance
    disposed of afterwards."""
    import dagster as dg

    from .defs.resources import OutputsResource
    from .sources import partition_keys

    outputs = (
        OutputsResource(output_root=args.output_root) if args.output_root else OutputsResource()
    )
    instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else None
    try:
        yield outputs.root(), list(args.partition or partition_keys()), instance
    finally:
        if instance is not None:
            instance.dispose()


if __name__ == "__main__":
    sys.exit(main())
