"""`raw_index` and `labels`: one row per image, its ids and paths; its native and unified labels.

Both come from one read of the native metadata (one step, two assets): ReXGradient's train
JSON is hundreds of megabytes, and parsing it once instead of twice halves the stage's time.
The checks on both tables run in the same step, on the tables in memory (check_specs).
"""

import dagster as dg
import pandas as pd

from ...processing.storage.source_store import file_state
from ...processing.tables.suite_validation import KeptReports
from ...processing.tables.table_schemas import RAW_INDEX
from ...settings import UNREADABLE_LIMIT_VARIABLE
from ...sources import (
    DatasetSource,
    SourceError,
    SplitTables,
    declared_schema,
    parse_partition_key,
)
from ...sources.base import arrow_system_allocator
from ...sources.preflight import ImagePresence, image_presence, missing_images_problem
from ...vocabulary import LABEL_COLUMNS
from ..checks.expectations import stored_in
from ..checks.index_and_labels import (
    CHECK_SPECS,
    check_results,
    start_suites,
    suites_selected,
)
from ..groups import ANNOTATIONS
from ..metadata import status_counts, table_code_version
from ..partitions import dataset_split_partitions
from ..previous_outputs import StageOutput, stage_fingerprint, tables_reused_or_built
from ..resources import DatasetsResource, OutputsResource, SuiteValidationResource
from ..row_errors import fail_if_strict
from ..run_settings import RunSettingsResource
from ..stages import selected_output, stage_out
from .source_files import source_files

CODE_VERSION = "3"  # 2: status and error columns (issue 9); 3: parent identity (issue 21)

# The tables in the order they are yielded, each with the metadata the stage writes for it.
OUTPUTS = (
    StageOutput(
        "raw_index", ("image_dir", "image_formats", "view_positions", "status", "images_present")
    ),
    StageOutput("labels", ("counts", "positives", "reports")),
)


@dg.multi_asset(
    outs={
        "raw_index": stage_out(
            RAW_INDEX,
            ANNOTATIONS,
            CODE_VERSION,
            description=(
                "One row per image that the dataset's metadata names: image_id "
                "(`<dataset>/<native id>`), image_key, patient/study ids, image_path relative "
                "to the dataset's image folder, format, normalized view position, source size, "
                "and documented dataset-specific columns."
            ),
            kinds={"parquet", "pandas"},
        ),
        "labels": stage_out(
            declared_schema("labels"),
            ANNOTATIONS,
            CODE_VERSION,
            description=(
                "Per image: the dataset's native label columns, report text (null, never "
                "'None'), phrases, and the 21 unified tri-state label_* columns "
                "(1 positive, 0 negative, null not annotated)."
            ),
            kinds={"parquet", "pandas"},
        ),
    },
    internal_asset_deps={
        "raw_index": {source_files.key},
        "labels": {source_files.key, dg.AssetKey("raw_index")},
    },
    deps=[source_files],
    check_specs=CHECK_SPECS,
    partitions_def=dataset_split_partitions,
    can_subset=True,
)
def raw_index_and_labels(
    context: dg.AssetExecutionContext,
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
    suite_validation: SuiteValidationResource,
):
    dataset, split = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    fingerprint = stage_fingerprint(
        table_code_version(CODE_VERSION), context.partition_key, source, split
    )
    validators: list[KeptReports] = []

    def validator(source_bytes: int) -> KeptReports:
        return KeptReports(
            suite_validation.for_source(source_bytes),
            outputs.root(),
            context.partition_key,
            stored_in(context.partition_key),
        )

    def build() -> dict[str, tuple[pd.DataFrame, dict]]:
        # Started before the read, so that a helper's GX import overlaps it.
        validators.append(validator(_validated_source_bytes(context, source, split)))
        tables, present = _read_tables(context, source, split, run_settings)
        built = _outputs(source, split, tables)
        built["raw_index"][1]["images_present"] = dg.MetadataValue.int(present)
        return built

    # Counting and summarizing the tables allocate Arrow memory too (hash tables over 239k
    # ids for ReXGradient train): same allocator as the read, see arrow_system_allocator.
    with arrow_system_allocator():
        # The same metadata files and code: the tables they gave.
        written = tables_reused_or_built(context, OUTPUTS, fingerprint, outputs.root(), build)
        tables = SplitTables(index=written["raw_index"][0], labels=written["labels"][0])
        # The tables are final: their validation goes on while the rest is checked.
        suites = start_suites(
            context.selected_asset_check_keys, validators[0] if validators else validator(0), tables
        )
        fail_if_strict(tables.index, run_settings.strict, "raw_index")
        metrics = source.count_metrics(tables)
    context.log.info(f"{context.partition_key}: {len(tables.index)} images, {metrics}")
    for output in OUTPUTS:
        yield from selected_output(context, output.asset, *written[output.asset])
    yield from check_results(
        context.selected_asset_check_keys,
        source,
        split,
        tables,
        metrics,
        run_settings.strict,
        suites,
    )


def _read_tables(
    context: dg.AssetExecutionContext,
    source: DatasetSource,
    split: str,
    run_settings: RunSettingsResource,
) -> tuple[SplitTables, int]:
    """The split's tables read from the dataset's metadata, and how many named images are
    there (the partition fails when most are missing)."""
    try:
        tables = source.read_split(split)
    except SourceError as exc:
        raise dg.Failure(
            description=str(exc), metadata={"partition": context.partition_key}
        ) from exc
    tables = _with_parent_identity(source, split, tables)
    for note in source.layout_notes():
        context.log.info(f"{context.partition_key}: {note}")
    presence = _fail_if_images_mostly_missing(
        context.partition_key, source, split, tables, run_settings.unreadable_limit
    )
    return tables, presence.present


def _validated_source_bytes(
    context: dg.AssetExecutionContext, source: DatasetSource, split: str
) -> int:
    """The size of the metadata the step's suites validate (what decides whether GX is
    imported in a helper while it is read); 0 when no suite is selected or a file is not
    there (the read reports that)."""
    if not suites_selected(context.selected_asset_check_keys):
        return 0
    try:
        return sum(file_state(path)[0] for path in source.annotation_files(split))
    except (OSError, SourceError):
        return 0


def _fail_if_images_mostly_missing(
    partition: str, source: DatasetSource, split: str, tables: SplitTables, limit: float
) -> ImagePresence:
    """One listing of the image folder: when most named images are not there (a wrong root),
    the partition fails here rather than as an error row per image in `images`."""
    presence = image_presence(source, split, tables)
    if presence.missing_share > limit:
        problem = missing_images_problem(source, split, presence, limit)
        raise dg.Failure(
            description=f"{partition}: {problem.what}. Fix: {problem.fix}",
            metadata={
                "missing_images": presence.missing,
                "named_images": presence.named,
                "limit": dg.MetadataValue.text(
                    f"{UNREADABLE_LIMIT_VARIABLE}={limit} (the share that may be missing)"
                ),
            },
        )
    return presence


def _with_parent_identity(source: DatasetSource, split: str, tables: SplitTables) -> SplitTables:
    """The index with the parent columns (before status and error, as declared)."""
    try:
        identity = source.parent_identity(split, tables.index)
    except SourceError as exc:
        raise dg.Failure(description=str(exc)) from exc
    index = tables.index.drop(columns=["status", "error"])
    index = pd.concat([index, identity.set_axis(index.index)], axis=1)
    index[["status", "error"]] = tables.index[["status", "error"]]
    return SplitTables(index=index, labels=tables.labels)


def _outputs(source: DatasetSource, split: str, tables: SplitTables) -> dict[str, tuple]:
    """Each output's table and its materialization metadata."""
    return {
        "raw_index": (
            tables.index,
            {
                "image_dir": dg.MetadataValue.path(str(source.image_dir(split))),
                "image_formats": dg.MetadataValue.json(_value_counts(tables.index["image_format"])),
                "view_positions": dg.MetadataValue.json(
                    _value_counts(tables.index["view_position"])
                ),
                "status": dg.MetadataValue.json(status_counts(tables.index)),
            },
        ),
        "labels": (
            tables.labels,
            {
                "counts": dg.MetadataValue.json(source.count_metrics(tables)),
                "positives": dg.MetadataValue.json(
                    {
                        column: int(tables.labels[column].eq(1).sum())
                        for column in LABEL_COLUMNS
                        if tables.labels[column].notna().any()
                    }
                ),
                "reports": int(tables.labels["report"].notna().sum()),
            },
        ),
    }


def _value_counts(series) -> dict[str, int]:
    return {str(k): int(v) for k, v in series.value_counts(dropna=False).items()}
