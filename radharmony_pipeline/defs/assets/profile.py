"""`partition_profile` and `corpus_profile`: what a partition and the whole corpus contain,
as plots on the assets' pages and PNGs under `<output>/previews/profile/`."""

import base64

import dagster as dg
import pandas as pd

from ...processing.corpus.profile_plots import CorpusTables, label_prevalence, profile_pngs
from ...processing.reports.report_table import empty_report_labels, report_label_prevalence
from ...processing.storage.output_layout import preview, table_file
from ...processing.storage.store import OutputPath, exists, publish_bytes
from ...processing.tables.table_schemas import CORPUS_PROFILE, PARTITION_PROFILE, PARTITION_TABLES
from ..automation import REBUILD_WHEN_CHANGED
from ..groups import CORPUS
from ..metadata import definition_metadata, table_code_version
from ..partitions import OWNERS, dataset_split_partitions, every_partition_of
from ..previous_outputs import StageOutput, files_fingerprint, input_table, reused_or_built
from ..resources import OutputsResource
from ..stages import corpus_table

CODE_VERSION = "1"
FILE_DPI = 100
# The UI shows inline metadata in a dialog about 1,000 pixels wide: the 4-panel rows fit.
INLINE_DPI = 56
# Drawn where materialized (a partition without them shows no report panel).
REPORT_LABELS = "report_labels"
# A partition's profile is drawn from these tables, in CorpusTables' order.
PARTITION_PROFILE_INPUTS = (*PARTITION_TABLES, REPORT_LABELS)
DESCRIPTION = (
    "label prevalence per unified class (positive / negative / not annotated, per dataset), "
    "the labels read from reports (positive / uncertain / negative / not mentioned per "
    "observation, per dataset with reports), "
    "view positions, source image sizes, report length, mask area fraction per class, box "
    "size and a box position heat map, and the class co-occurrence matrix of every dataset "
    "annotating all its classes on every image (ChestX-Det). The table holds the prevalence "
    "counts."
)
# What every profile's materialization shows: its PNG, the same inline, the images drawn.
PROFILE_METADATA = ("profile", "profile_inline", "images")
OUTPUT = StageOutput(PARTITION_PROFILE.name, (*PROFILE_METADATA, "report_label_prevalence"))


@dg.asset(
    partitions_def=dataset_split_partitions,
    owners=OWNERS,
    group_name=CORPUS,
    description=f"A visual profile of the partition: {DESCRIPTION}",
    automation_condition=REBUILD_WHEN_CHANGED,
    code_version=table_code_version(CODE_VERSION),
    metadata=definition_metadata(PARTITION_PROFILE),
    kinds={"png", "parquet"},
    # Read in the step, not as inputs: an unchanged partition's tables are not loaded at all.
    deps=PARTITION_PROFILE_INPUTS,
)
def partition_profile(
    context: dg.AssetExecutionContext, outputs: OutputsResource
) -> dg.Output[pd.DataFrame]:
    root = outputs.root()
    partition = context.partition_key
    files = [table_file(root, name, partition) for name in PARTITION_PROFILE_INPUTS]
    fingerprint = files_fingerprint([table_code_version(CODE_VERSION), partition], files)

    def build() -> tuple[pd.DataFrame, dict]:
        inputs = (input_table(root, name, partition) for name in PARTITION_PROFILE_INPUTS)
        tables = CorpusTables(*inputs)
        output = _profile(tables, partition, outputs)
        # One entry per observation: the metadata does not grow with the images.
        output.metadata["report_label_prevalence"] = dg.MetadataValue.json(
            report_label_prevalence(tables.report_labels)
        )
        return output.value, dict(output.metadata)

    # Its tables' files as they were then, and its PNG still there: the last profile.
    table, metadata = reused_or_built(
        context,
        OUTPUT,
        fingerprint,
        root,
        build,
        still_there=lambda _: exists(_png(root, partition)),
    )
    return dg.Output(table, metadata=metadata)


@corpus_table(
    CORPUS_PROFILE,
    CORPUS,
    CODE_VERSION,
    description=f"A visual profile of every materialized partition together: {DESCRIPTION}",
    ins=every_partition_of(*PARTITION_PROFILE_INPUTS),
    kinds=frozenset({"png", "parquet"}),
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


def _png(root: OutputPath, name: str) -> OutputPath:
    return root / preview("profile", name)


def _profile(tables: CorpusTables, name: str, outputs: OutputsResource) -> dg.Output:
    root = outputs.root()
    path = _png(root, name)
    title = f"RadHarmony profile: {name} ({len(tables.raw_index):,} images)"
    png, small = profile_pngs(tables, title, dpis=(FILE_DPI, INLINE_DPI))
    publish_bytes(path, png)
    inline = f"![profile of {name}](data:image/png;base64,{base64.b64encode(small).decode()})"
    file_entry, inline_entry, images_entry = PROFILE_METADATA
    return dg.Output(
        label_prevalence(tables),
        metadata={
            file_entry: dg.MetadataValue.path(str(path)),
            inline_entry: dg.MetadataValue.md(inline),
            images_entry: len(tables.raw_index),
        },
    )
