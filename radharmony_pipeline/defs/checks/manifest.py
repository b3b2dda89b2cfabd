"""Checks on the unified manifest: dataset totals, paths, a GX suite, patient leakage."""

import dagster as dg
import pandas as pd

from ...processing.expectations import manifest_expectations, validate_table
from ...processing.storage import listing
from ...processing.vocabulary import LABEL_COLUMNS
from ...sources import SOURCE_TYPES
from ...sources.counts import CountComparison, compare_counts
from ..resources import DatasetsResource, OutputsResource
from .counts import comparison_table
from .expectations import suite_result


def manifest_totals(rows: pd.DataFrame) -> dict[str, int]:
    """Figures of one dataset's rows that the documentation gives as dataset totals."""
    annotated = [c for c in LABEL_COLUMNS if rows[c].notna().any()]
    positives = rows[annotated].eq(1)
    return {
        "images": len(rows),
        "annotations": int(rows["bboxes"].map(len).sum()),
        "negatives": int((~positives.any(axis=1)).sum()),
        **{f"class_images.{c.removeprefix('label_')}": int(positives[c].sum()) for c in annotated},
    }


@dg.asset_check(
    asset="unified_manifest",
    blocking=True,
    description="Dataset totals equal the documentation once every split of a dataset is in "
    "(MS-CXR 1,047 images and 1,448 boxes; ChestX-Det 3,578 images, 9,639 instances, 611 "
    "negatives, per-class image counts).",
)
def manifest_totals_match_documentation(
    unified_manifest: pd.DataFrame, datasets: DatasetsResource
) -> dg.AssetCheckResult:
    comparisons: list[CountComparison] = []
    pending = []
    for key, source_type in SOURCE_TYPES.items():
        rows = unified_manifest[unified_manifest["dataset"] == key]
        if set(rows["split"]) != set(source_type.splits):
            pending.append(key)
            continue
        found = manifest_totals(rows)
        total = datasets.source(key).expected_counts().total
        wanted = {m: v for m, v in total.items() if m in found or m.startswith("class_images.")}
        if not source_type.has_boxes:
            wanted.pop("annotations", None)
        comparisons += [
            CountComparison(f"{key}: {c.metric}", c.expected, c.found)
            for c in compare_counts(wanted, found)
        ]
    mismatches = [c for c in comparisons if not c.matches]
    return dg.AssetCheckResult(
        passed=not mismatches,
        metadata={
            "comparison": dg.MetadataValue.md(comparison_table(comparisons)),
            "datasets_not_complete": dg.MetadataValue.json(pending),
        },
        description="; ".join(
            f"{c.metric}: expected {c.expected}, found {c.found}" for c in mismatches
        )
        or f"{len(comparisons)} totals match",
    )


@dg.asset_check(
    asset="unified_manifest",
    blocking=True,
    description="Every image, mask and packed-array path in the manifest exists.",
)
def manifest_paths_exist(
    unified_manifest: pd.DataFrame, outputs: OutputsResource
) -> dg.AssetCheckResult:
    root = outputs.root()
    missing = []
    # One listing per top-level folder instead of one request per file on object storage.
    listed = {f"{top}/{name}" for top in ("images", "masks") for name in listing(root / top)}
    for column in ("image_path", "mask_path", "tensor_path"):
        paths = unified_manifest[column].dropna().unique()
        missing += [f"{column}: {p}" for p in paths if p not in listed]
    return dg.AssetCheckResult(
        passed=not missing,
        metadata={"missing": len(missing), "examples": dg.MetadataValue.json(missing[:20])},
    )


@dg.asset_check(
    asset="unified_manifest",
    blocking=True,
    description="GX suite over the manifest's columns: unique ids, known datasets/splits/views,"
    " labels in {0, 1, null}, report never 'None', sizes positive.",
)
def manifest_suite(unified_manifest: pd.DataFrame) -> dg.AssetCheckResult:
    return suite_result(
        validate_table(unified_manifest, "unified_manifest", manifest_expectations(LABEL_COLUMNS))
    )


@dg.asset_check(
    asset="unified_manifest",
    description="No patient_id in both a dataset's train and test splits (warning: ChestX-Det "
    "has no patient ids; an official split may leak).",
)
def no_patient_in_train_and_test(unified_manifest: pd.DataFrame) -> dg.AssetCheckResult:
    leaks = {}
    for key, rows in unified_manifest.dropna(subset=["patient_id"]).groupby("dataset"):
        train = set(rows.loc[rows["split"] == "train", "patient_id"])
        test = set(rows.loc[rows["split"] == "test", "patient_id"])
        if train & test:
            leaks[str(key)] = len(train & test)
    return dg.AssetCheckResult(
        passed=not leaks,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"shared_patients": dg.MetadataValue.json(leaks)},
    )
