"""`report_labels`: per image with a report, the observations its report states (1 positive,
0 negative, -1 uncertain, null not mentioned), from the report labeler or the dataset's own
report-label file. Its checks run in the same step, on the table in memory (check_specs)."""

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import dagster as dg
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ...processing.reports.labeler_version import LABELER_VERSION
from ...processing.reports.report_table import (
    empty_report_labels,
    file_labels,
    label_reports,
    report_label_prevalence,
    unmentioned_share,
)
from ...processing.storage.output_layout import table_file
from ...processing.storage.store import OutputPath, exists, open_for_reading
from ...processing.tables.membership import is_in
from ...processing.tables.table_schemas import REPORT_LABELS, REPORT_RULES
from ...sources import DatasetSource, SourceError, parse_partition_key
from ..checks.report_labels import CHECK_SPECS, check_results
from ..groups import ANNOTATIONS
from ..resources import DatasetsResource, OutputsResource
from ..stages import checked_stage, selected_output

if TYPE_CHECKING:
    from ...processing.reports.labeler import ReportReading

# A new labeler makes the asset stale in the UI; its rows get new keys, so the next
# materialization reads every text again.
CODE_VERSION = f"1|{LABELER_VERSION}"
ASSET = "report_labels"


@checked_stage(
    ASSET,
    ANNOTATIONS,
    REPORT_LABELS,
    CODE_VERSION,
    check_specs=CHECK_SPECS,
    ins={"raw_index": dg.AssetIn("raw_index"), "labels": dg.AssetIn("labels")},
    description=(
        "Per image with a report: every report observation as the report states it "
        "(`report_label_<name>`: 1 positive, 0 negative, -1 uncertain, null not mentioned), "
        "where it comes from (`report_label_source`: `report_rules`, the project's labeler "
        "reading the findings and impression, or `mimic_chexpert`, MIMIC-CXR's own CheXpert "
        "labels of the study when its file is at the MIMIC-CXR root) and the sentence that "
        "decided each positive or uncertain label. Each distinct text is read once; rows are "
        "keyed by the labeler's version and the text's SHA-256, so a rerun reads only new "
        "texts. Datasets without reports (or MS-CXR without the CheXpert file) give an empty "
        "table. See docs/report-labels.md."
    ),
    kinds={"parquet", "pandas"},
)
def report_labels(
    context: dg.AssetExecutionContext,
    raw_index: pd.DataFrame,
    labels: pd.DataFrame,
    datasets: DatasetsResource,
    outputs: OutputsResource,
) -> Iterator[dg.Output | dg.AssetCheckResult]:
    dataset, split = parse_partition_key(context.partition_key)
    source = datasets.source(dataset)
    if source.report_label_source == REPORT_RULES:
        previous_file = table_file(outputs.root(), ASSET, context.partition_key)
        table, expected, metadata = _read_reports(context, labels, previous_file)
    else:
        table, expected, metadata = _file_labels(source, split, raw_index)
    unmentioned, reports = unmentioned_share(table)
    metadata.update(
        {
            "rows": len(table),
            "source": str(source.report_label_source),
            "unmentioned_reports": unmentioned,
            # One entry per observation: the metadata does not grow with the images.
            "prevalence": dg.MetadataValue.json(report_label_prevalence(table)),
        }
    )
    context.log.info(
        f"{context.partition_key}: report labels for {len(table)} images ({reports} reports)"
    )
    yield from selected_output(context, ASSET, table, metadata)
    yield from check_results(context.selected_asset_check_keys, table, expected)


def _read_reports(
    context: dg.AssetExecutionContext, labels: pd.DataFrame, previous_file: OutputPath
) -> tuple[pd.DataFrame, pd.Series, dict]:
    """The report texts of `labels` read by the labeler, reusing the last run's rows."""
    result = label_reports(
        labels["image_id"],
        labels["report"],
        LabelerOnFirstUse(),
        LABELER_VERSION,
        previous=_previous_rows(context, previous_file),
    )
    expected = labels.loc[labels["report"].notna(), "image_id"].astype("string")
    return (
        result.table,
        expected.reset_index(drop=True),
        {
            "labeler_version": LABELER_VERSION,
            "distinct_reports": result.distinct_reports,
            "labelled": result.labelled,
            "reused": result.reused,
        },
    )


class LabelerOnFirstUse:
    """The report labeler, built when a text is first to be read: a partition whose texts
    were all read before (an unchanged re-run) never imports spaCy, which takes seconds."""

    def read_many(self, texts: Sequence[str]) -> list["ReportReading"]:
        from ...processing.reports.labeler import ReportLabeler

        return ReportLabeler().read_many(texts)


def _previous_rows(context: dg.AssetExecutionContext, path: OutputPath) -> pa.Table | None:
    """The partition's last report_labels file, as Arrow (its evidence stays Arrow: turning
    hundreds of thousands of lists into Python objects would cost more than the rest)."""
    if not exists(path):
        return None
    try:
        with open_for_reading(path) as handle:
            table = pq.read_table(handle, page_checksum_verification=True)
    except (OSError, ValueError) as error:
        # Only a cache: a damaged file means every text is read again.
        context.log.warning(f"{path}: not reused ({error}); every report is read again")
        return None
    if not set(REPORT_LABELS.names) <= set(table.column_names):
        return None  # written under an older declaration
    return table


def _file_labels(
    source: DatasetSource, split: str, raw_index: pd.DataFrame
) -> tuple[pd.DataFrame, pd.Series, dict]:
    """The labels the dataset's own file gives, or an empty table saying why there are none."""
    empty = pd.Series(dtype="string")
    if source.report_label_source is None:
        return empty_report_labels(), empty, {"note": f"{source.key} has no reports"}
    try:
        found = source.read_report_labels(split, raw_index)
    except SourceError as error:
        raise dg.Failure(description=str(error)) from error
    if found is None:
        note = (
            f"no report label file for {source.key} ({source.report_label_source}): the "
            "partition has no report labels; see docs/report-labels.md for where it goes"
        )
        return empty_report_labels(), empty, {"note": note}
    table = file_labels(found.labels, source.report_label_source, found.path.name)
    # Studies the file does not label (its reports were not read): counted, not an error.
    unlabelled = int((~is_in(raw_index["image_id"], table["image_id"])).sum())
    return (
        table,
        table["image_id"].astype("string"),
        {
            "report_label_file": dg.MetadataValue.path(str(found.path)),
            "images_without_study_labels": unlabelled,
        },
    )
