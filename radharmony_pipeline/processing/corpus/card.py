"""The corpus card: every figure computed from the manifest, the near-duplicate table and the
check results, written as DATASET_CARD.md and as a Croissant description (mlcroissant)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import pandas as pd
import pyarrow as pa

from radharmony_pipeline.processing.reports.report_table import PREVALENCE_STATES
from radharmony_pipeline.processing.storage.output_layout import MANIFEST, resized_png_glob
from radharmony_pipeline.processing.tables.table_schemas import (
    REPORT_LABEL_COLUMNS,
    REPORT_LABEL_PREFIX,
    UNIFIED_MANIFEST,
)
from radharmony_pipeline.vocabulary import LABEL_COLUMNS, UNIFIED_LABELS

CARD_NAME = "DATASET_CARD.md"
CROISSANT_NAME = "croissant.json"
MANIFEST_FILE = MANIFEST
IMAGE_FILES = resized_png_glob()


@dataclass(frozen=True)
class SourceFacts:
    """A source as its dataset page states it."""

    dataset: str
    title: str
    homepage: str
    licence: str
    citation: str


@dataclass(frozen=True)
class CheckOutcome:
    """The latest evaluation of one check (of one partition, for partitioned checks)."""

    asset: str
    check: str
    partition: str | None
    passed: bool
    severity: str
    description: str


@dataclass(frozen=True)
class CardInputs:
    manifest: pd.DataFrame
    near_duplicates: pd.DataFrame
    sources: Sequence[SourceFacts]
    checks: Sequence[CheckOutcome]
    # Settings read from the outputs (image size, resize mode), never defaults typed in.
    settings: Mapping[str, Any]
    # Per partition, the data version of the downloaded files the corpus was built from.
    data_versions: Mapping[str, str]
    pipeline_version: str


def card_figures(inputs: CardInputs) -> dict[str, Any]:
    """Every figure of the card, as plain JSON values."""
    manifest = inputs.manifest
    return {
        "images": len(manifest),
        "counts": _counts(manifest),
        "prevalence": _prevalence(manifest),
        "report_labels": _report_prevalence(manifest),
        "masks": _mask_availability(manifest),
        "boxes": _box_availability(manifest),
        "near_duplicates": _duplicate_findings(inputs.near_duplicates),
        "checks": {
            "evaluated": len(inputs.checks),
            "passed": sum(c.passed for c in inputs.checks),
            "failed": sum(not c.passed for c in inputs.checks),
        },
        "missing_patient_ids": {
            str(dataset): int(group["patient_id"].isna().sum())
            for dataset, group in manifest.groupby("dataset", sort=True)
        },
    }


def _counts(manifest: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for (dataset, split), group in manifest.groupby(["dataset", "split"], sort=True):
        boxes = group["bboxes"].map(len)
        rows.append(
            {
                "dataset": str(dataset),
                "split": str(split),
                "images": len(group),
                "patients": int(group["patient_id"].nunique()),
                "studies": int(group["study_id"].nunique()),
                "with_mask": int(group["has_mask"].sum()),
                "with_boxes": int((boxes > 0).sum()),
                "boxes": int(boxes.sum()),
                "with_report": int(group["report"].notna().sum()),
            }
        )
    return rows


def _prevalence(manifest: pd.DataFrame) -> dict[str, dict[str, dict[str, int]]]:
    """dataset -> label -> positive / negative / not_annotated (other values, e.g. -1
    uncertain, counted apart)."""
    figures: dict[str, dict[str, dict[str, int]]] = {}
    for dataset, group in manifest.groupby("dataset", sort=True):
        per_label = {}
        for name, column in zip(UNIFIED_LABELS, LABEL_COLUMNS, strict=True):
            values = group[column]
            known = values.dropna()
            per_label[name] = {
                "positive": int((known == 1).sum()),
                "negative": int((known == 0).sum()),
                "other": int(((known != 1) & (known != 0)).sum()),
                "not_annotated": int(values.isna().sum()),
            }
        figures[str(dataset)] = per_label
    return figures


def _report_prevalence(manifest: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """dataset -> where its report labels come from, and per observation the images positive,
    uncertain, negative and not mentioned; only datasets with report labels."""
    figures: dict[str, dict[str, Any]] = {}
    for dataset, group in manifest.groupby("dataset", sort=True):
        sources = group["report_label_source"].dropna()
        if sources.empty:
            continue
        per_observation = {}
        for column in REPORT_LABEL_COLUMNS:
            values = group.loc[sources.index, column]
            per_observation[column.removeprefix(REPORT_LABEL_PREFIX)] = {
                **{
                    state: int(values.eq(value).sum()) for state, value in PREVALENCE_STATES.items()
                },
                "not_mentioned": int(values.isna().sum()),
            }
        figures[str(dataset)] = {
            "images": len(sources),
            "sources": sorted(sources.astype(str).unique()),
            "observations": per_observation,
        }
    return figures


def _mask_availability(manifest: pd.DataFrame) -> dict[str, dict[str, int]]:
    figures = {}
    for dataset, group in manifest.groupby("dataset", sort=True):
        classes = group["mask_classes"].explode().dropna().value_counts()
        figures[str(dataset)] = {
            "annotated_images": int(group["has_mask"].sum()),
            **{f"class:{name}": int(n) for name, n in sorted(classes.items())},
        }
    return figures


def _box_availability(manifest: pd.DataFrame) -> dict[str, dict[str, int]]:
    figures = {}
    for dataset, group in manifest.groupby("dataset", sort=True):
        labels = group["bbox_labels"].explode().dropna().value_counts()
        phrases = group["label_text"].explode().dropna()
        figures[str(dataset)] = {
            "images_with_boxes": int((group["bboxes"].map(len) > 0).sum()),
            "boxes_with_phrase": len(phrases),
            **{f"class:{name}": int(n) for name, n in sorted(labels.items())},
        }
    return figures


def _duplicate_findings(members: pd.DataFrame) -> dict[str, Any]:
    if members.empty:
        return {"groups": 0, "images": 0, "by_kind": {}, "cross_split_groups": 0,
                "cross_dataset_groups": 0}  # fmt: skip
    groups = members.drop_duplicates("group_id")
    return {
        "groups": len(groups),
        "images": len(members),
        "by_kind": {str(k): int(n) for k, n in members["kind"].value_counts().sort_index().items()},
        "cross_split_groups": int((groups["group_splits"].map(len) > 1).sum()),
        "cross_dataset_groups": int((groups["group_datasets"].map(len) > 1).sum()),
    }


def card_markdown(inputs: CardInputs, figures: Mapping[str, Any]) -> str:
    """DATASET_CARD.md: the same figures as the Croissant file, for people."""
    lines = [
        "# RadHarmony corpus",
        "",
        f"{figures['images']:,} images from {len(inputs.sources)} chest X-ray datasets, "
        "harmonized to one 21-class tri-state label vocabulary, resized images, masks and boxes.",
        "",
        f"- pipeline version: `{inputs.pipeline_version}`",
        *(f"- {name}: `{value}`" for name, value in sorted(inputs.settings.items())),
        "",
        "## Sources",
        "",
        "| dataset | title | licence | citation | page |",
        "|---|---|---|---|---|",
        *(
            f"| `{s.dataset}` | {s.title} | {s.licence} | {s.citation} | {s.homepage} |"
            for s in inputs.sources
        ),
        "",
        "## Counts",
        "",
        "| dataset | split | images | patients | studies | with mask | with boxes | boxes "
        "| with report |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['dataset']} | {r['split']} | {r['images']} | {r['patients']} | "
            f"{r['studies']} | {r['with_mask']} | {r['with_boxes']} | {r['boxes']} | "
            f"{r['with_report']} |"
            for r in figures["counts"]
        ),
        "",
        "## Label prevalence",
        "",
        "Positive / negative / not annotated images per unified label (`—`: the dataset does "
        "not annotate the label on any image).",
        "",
        *_prevalence_table(figures["prevalence"]),
        "",
        *_report_label_lines(figures["report_labels"]),
        "## Masks and boxes",
        "",
        *_availability_lines("Masks", figures["masks"]),
        *_availability_lines("Boxes", figures["boxes"]),
        "## Checks",
        "",
        f"{figures['checks']['evaluated']} check evaluations: {figures['checks']['passed']} "
        f"passed, {figures['checks']['failed']} failed.",
        "",
        "| asset | check | partition | result | expected vs found |",
        "|---|---|---|---|---|",
        *(
            f"| {c.asset} | {c.check} | {c.partition or '—'} | "
            f"{'passed' if c.passed else 'failed (' + c.severity + ')'} | "
            f"{_cell(c.description)} |"
            for c in inputs.checks
        ),
        "",
        "## Near duplicates and leakage",
        "",
        *_duplicate_lines(figures["near_duplicates"]),
        "",
        "## Known limits",
        "",
        *_limit_lines(figures),
        "",
        "## Input data versions",
        "",
        "| partition | data version |",
        "|---|---|",
        *(f"| {key} | `{version}` |" for key, version in sorted(inputs.data_versions.items())),
        "",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _prevalence_table(prevalence: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[str]:
    datasets = sorted(prevalence)
    lines = [
        "| label | " + " | ".join(datasets) + " |",
        "|---|" + "---:|" * len(datasets),
    ]
    for name in UNIFIED_LABELS:
        cells = []
        for dataset in datasets:
            counts = prevalence[dataset][name]
            annotated = counts["positive"] + counts["negative"] + counts["other"]
            cells.append(
                "—"
                if not annotated
                else f"{counts['positive']} / {counts['negative']} / {counts['not_annotated']}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _report_label_lines(figures: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report labels' section: derived from the report text, not annotated."""
    if not figures:
        return []
    datasets = sorted(figures)
    states = "/".join([*PREVALENCE_STATES, "not mentioned"])
    lines = [
        "## Labels derived from reports",
        "",
        f"`{REPORT_LABEL_PREFIX}*` columns are read from each image's report, not annotated "
        "by the dataset: "
        + "; ".join(
            f"{d}: {figures[d]['images']} images ({', '.join(figures[d]['sources'])})"
            for d in datasets
        )
        + f". Images {states} per observation (docs/report-labels.md).",
        "",
        "| observation | " + " | ".join(datasets) + " |",
        "|---|" + "---:|" * len(datasets),
    ]
    for column in REPORT_LABEL_COLUMNS:
        name = column.removeprefix(REPORT_LABEL_PREFIX)
        cells = [
            " / ".join(str(n) for n in figures[d]["observations"][name].values()) for d in datasets
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _availability_lines(title: str, figures: Mapping[str, Mapping[str, int]]) -> list[str]:
    lines = [f"{title}:", ""]
    for dataset, counts in figures.items():
        parts = ", ".join(f"{name} {n}" for name, n in counts.items())
        lines.append(f"- `{dataset}`: {parts}")
    lines.append("")
    return lines


def _duplicate_lines(findings: Mapping[str, Any]) -> list[str]:
    kinds = ", ".join(f"{kind} {n}" for kind, n in findings["by_kind"].items()) or "none"
    return [
        f"- groups: {findings['groups']} ({findings['images']} images; by kind: {kinds})",
        f"- groups spanning more than one split: {findings['cross_split_groups']}",
        f"- groups spanning more than one dataset: {findings['cross_dataset_groups']}",
    ]


def _limit_lines(figures: Mapping[str, Any]) -> list[str]:
    missing = figures["missing_patient_ids"]
    images = {dataset: 0 for dataset in missing}
    for row in figures["counts"]:
        images[row["dataset"]] += row["images"]
    not_annotated = sum(
        counts["not_annotated"]
        for labels in figures["prevalence"].values()
        for counts in labels.values()
    )
    lines = [
        f"- Not annotated is not negative: {not_annotated:,} label values are null because "
        "their dataset does not annotate that class; leave them out of a loss rather than "
        "reading them as 0.",
        "- `has_mask` false means no mask was drawn, not an empty mask.",
    ]
    for dataset, count in missing.items():
        if count:
            lines.append(
                f"- `{dataset}`: {count} of {images[dataset]} images have no patient id, so "
                "patient-level leakage between its splits cannot be checked."
            )
    return lines


_CROISSANT_TYPES = (
    (pa.types.is_boolean, "BOOL"),
    (pa.types.is_integer, "INTEGER"),
    (pa.types.is_floating, "FLOAT"),
    (pa.types.is_timestamp, "DATE"),
    (pa.types.is_string, "TEXT"),
)


def croissant_metadata(
    inputs: CardInputs, figures: Mapping[str, Any], manifest_sha256: str
) -> dict[str, Any]:
    """The Croissant JSON-LD of the corpus: the manifest file, the image files, and a record
    set of the manifest's scalar columns, with the counts in its description. Built through
    mlcroissant; any error it reports is raised here."""
    import mlcroissant as mlc

    fields = []
    for column in UNIFIED_MANIFEST.columns:
        data_type = next((t for test, t in _CROISSANT_TYPES if test(column.type)), None)
        if data_type is None:  # list columns: described in the card, read from the Parquet
            continue
        fields.append(
            mlc.Field(
                id=f"unified_manifest/{column.name}",
                name=column.name,
                description=column.description,
                data_types=[getattr(mlc.DataType, data_type)],
                source=mlc.Source(
                    file_object="unified_manifest_file", extract=mlc.Extract(column=column.name)
                ),
            )
        )
    metadata = mlc.Metadata(
        name="RadHarmony corpus",
        description=(
            f"{figures['images']} chest X-ray images from "
            f"{', '.join(s.title for s in inputs.sources)}, harmonized to 21 tri-state labels. "
            "Images per dataset and split: "
            + ", ".join(f"{r['dataset']}/{r['split']} {r['images']}" for r in figures["counts"])
            + f". See {CARD_NAME} for prevalence, checks and near duplicates."
        ),
        version=inputs.pipeline_version,
        license=[f"{s.dataset}: {s.licence}" for s in inputs.sources],
        cite_as="; ".join(f"{s.dataset}: {s.citation}" for s in inputs.sources),
        data_limitations=_limit_lines(figures),
        distribution=[
            mlc.FileObject(
                id="unified_manifest_file",
                name=PurePosixPath(MANIFEST).name,
                content_url=MANIFEST_FILE,
                encoding_formats=["application/x-parquet"],
                sha256=manifest_sha256,
            ),
            mlc.FileSet(
                id="resized_images",
                name="resized images",
                includes=[IMAGE_FILES],
                encoding_formats=["image/png"],
            ),
        ],
        record_sets=[mlc.RecordSet(id="unified_manifest", name="unified_manifest", fields=fields)],
    )
    issues = metadata.ctx.issues
    if issues.errors:
        raise ValueError(f"the Croissant description is invalid: {issues.report()}")
    return metadata.to_json()
