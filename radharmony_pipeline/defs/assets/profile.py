"""`partition_profile` and `corpus_profile`: what a partition and the whole corpus contain,
as plots on the assets' pages and PNGs under `<output>/previews/profile/`."""

import base64

import dagster as dg
import pandas as pd

from ...processing.corpus.profile_plots import CorpusTables, label_prevalence, profile_pngs
from ...processing.reports.report_table import empty_report_labels, report_label_prevalence
from ...processing.storage.output_layout import preview
from ...processing.storage.store import publish
from ...processing.tables.table_schemas import CORPUS_PROFILE, PARTITION_PROFILE, PARTITION_TABLES
from ..automation import REBUILD_WHEN_CHANGED, REBUILD_WHEN_PARTITIONS_SETTLE
from ..groups import CORPUS
from ..metadata import definition_metadata, table_code_version
from ..partitions import OWNERS, dataset_split_partitions, every_partition_of
from ..resources import OutputsResource

CODE_VERSION = "1"
FILE_DPI = 100
# The UI shows inline metadata in a dialog about 1,000 pixels wide: the 4-panel rows fit.
INLINE_DPI = 56
# Drawn where materialized (a partition without them shows no report panel).
REPORT_LABELS = "report_labels"
DESCRIPTION = (
    "label prevalence per unified class (positive / negative / not annotated, per dataset), "
    "the labels read from reports (positive / uncertain / negative / not mentioned per "
    "observation, per dataset with reports), "
    "view positions, source image sizes, report length, mask area fraction per class, box "
    "size and a box position heat map, and the class co-occurrence matrix of every dataset "
    "annotating all its classes on every image (ChestX-Det). The table holds the prevalence "
    "counts."
)


@dg.asset(
    partitions_def=dataset_split_partitions,
    owners=OWNERS,
    group_name=CORPUS,
    description=f"A visual profile of the partition: {DESCRIPTION}",
    automation_condition=REBUILD_WHEN_CHANGED,
    code_version=table_code_version(CODE_VERSION),
    metadata=definition_metadata(PARTITION_PROFILE),
    kinds={"png", "parquet"},
)
def partition_profile(
    context: dg.AssetExecutionContext,
    raw_index: pd.DataFrame,
    labels: pd.DataFrame,
    masks: pd.DataFrame,
    bboxes: pd.DataFrame,
    images: pd.DataFrame,
    report_labels: pd.DataFrame,
    outputs: OutputsResource,
) -> dg.Output[pd.DataFrame]:
    tables = CorpusTables(raw_index, labels, masks, bboxes, images, report_labels)
    output = _profile(tables, context.partition_key, outputs)
    # One entry per observation: the metadata does not grow with the images.
    output.metadata["report_label_prevalence"] = dg.MetadataValue.json(
        report_label_prevalence(report_labels)
    )
    return output


@dg.asset(
    group_name=CORPUS,
    owners=OWNERS,
    ins=every_partition_of(*PARTITION_TABLES, REPORT_LABELS),
    description=f"A visual profile of every materialized partition together: {DESCRIPTION}",
    automation_condition=REBUILD_WHEN_PARTITIONS_SETTLE,
    code_version=table_code_version(CODE_VERSION),
    metadata=definition_metadata(CORPUS_PROFILE),
    kinds={"png", "parquet"},
)
def corpus_profile(
    raw_index: dict[str, pd.DataFrame],
    labels: dict[str, pd.DataFrame],
    masks: dict[str, pd.DataFrame],
    bboxes: dict[str, pd.DataFrame],
    images: dict[str, pd.DataFrame],
    report_labels: dict[str, pd.DataFrame],
    outputs: OutputsResource,
) -> dg.Output[pd.DataFrame]:
    complete = sorted(set(raw_index) & set(labels) & set(masks) & set(bboxes) & set(images))
    if not complete:
        raise dg.Failure(description="no partition has every stage materialized yet")
    reports = [report_labels[key] for key in complete if key in report_labels]
    tables = CorpusTables(
        *(
            pd.concat([stage[key] for key in complete], ignore_index=True)
            for stage in (raw_index, labels, masks, bboxes, images)
        ),
        pd.concat([empty_report_labels(), *reports], ignore_index=True),
    )
    output = _profile(tables, "corpus", outputs)
    output.metadata["partitions"] = dg.MetadataValue.json(complete)
    return output


def _profile(tables: CorpusTables, name: str, outputs: OutputsResource) -> dg.Output:
    root = outputs.root()
    path = root / preview("profile", name)
    title = f"RadHarmony profile: {name} ({len(tables.raw_index):,} images)"
    png, small = profile_pngs(tables, title, dpis=(FILE_DPI, INLINE_DPI))
    publish(path, lambda handle: handle.write(png))
    inline = f"![profile of {name}](data:image/png;base64,{base64.b64encode(small).decode()})"
    return dg.Output(
        label_prevalence(tables),
        metadata={
            "profile": dg.MetadataValue.path(str(path)),
            "profile_inline": dg.MetadataValue.md(inline),
            "images": len(tables.raw_index),
        },
    )
