"""Checks on the unified manifest: dataset totals, paths, a GX suite, patient leakage."""

from itertools import combinations

import dagster as dg
import pandas as pd

from ...processing.storage import output_layout as layout
from ...processing.storage.store import listing
from ...processing.tables.suite_validation import InProcessValidation
from ...sources import SOURCE_TYPES
from ...sources.counts import CountComparison, compare_counts
from ...vocabulary import LABEL_COLUMNS
from ..resources import DatasetsResource, OutputsResource
from .counts import comparison_table, hint
from .expectations import suite_result


def manifest_totals(rows: pd.DataFrame) -> dict[str, int]:
    """Figures of one dataset's rows that the documentation gives as dataset totals."""
    annotated = [c for c in LABEL_COLUMNS if rows[c].notna().any()]
    positives = rows[annotated].eq(1)
    box_labels = pd.Series([label for labels in rows["bbox_labels"] for label in labels])
    return {
        "images": len(rows),
        "patients": int(rows["patient_id"].nunique()),
        "studies": int(rows["study_id"].nunique()),
        "annotations": int(rows["bboxes"].map(len).sum()),
        "negatives": int((~positives.any(axis=1)).sum()),
        "images_with_masks": int((rows["mask_classes"].map(len) > 0).sum()),
        **{f"class_images.{c.removeprefix('label_')}": int(positives[c].sum()) for c in annotated},
        **{f"class_annotations.{k}": int(v) for k, v in box_labels.value_counts().items()},
    }


def documented_totals() -> str:
    """The dataset totals the sources declare (`documented_counts.total`), in words."""
    described = []
    for key, source_type in SOURCE_TYPES.items():
        total = source_type.documented_counts.total
        figures = [
            f"{value:,} {metric.replace('_', ' ')}"
            for metric, value in total.items()
            if "." not in metric
        ]
        if any("." in metric for metric in total):
            figures.append("per-class counts")
        if figures:
            described.append(f"{key}: {', '.join(figures)}")
    return "; ".join(described)


def complete_datasets(manifest: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Rows of each dataset whose every split is in the manifest, and the incomplete ones."""
    complete, pending = {}, []
    for key, source_type in SOURCE_TYPES.items():
        rows = manifest[manifest["dataset"] == key]
        if set(rows["split"]) == set(source_type.splits):
            complete[key] = rows
        else:
            pending.append(key)
    return complete, pending


def figures_result(
    comparisons: dict[str, list[CountComparison]],
    datasets: DatasetsResource,
    pending: list[str],
    found: dict[str, dict],
) -> dg.AssetCheckResult:
    """Pass when every comparison matches; expected vs found, and what is probably wrong."""
    flat = [c for items in comparisons.values() for c in items]
    mismatches = {key: [c for c in items if not c.matches] for key, items in comparisons.items()}
    metadata = {
        "comparison": dg.MetadataValue.md(comparison_table(flat)),
        "found": dg.MetadataValue.json(found),
        "datasets_not_complete": dg.MetadataValue.json(pending),
    }
    hints = [
        f"- {hint(datasets.source(key), list(SOURCE_TYPES[key].splits), c)}"
        for key, items in mismatches.items()
        for c in items
    ]
    if hints:
        metadata["probably_wrong"] = dg.MetadataValue.md("\n".join(hints))
    wrong = [c for items in mismatches.values() for c in items]
    return dg.AssetCheckResult(
        passed=not wrong,
        metadata=metadata,
        description="; ".join(f"{c.metric}: expected {c.expected}, found {c.found}" for c in wrong)
        or f"{len(flat)} figures match",
    )


@dg.asset_check(
    asset="unified_manifest",
    blocking=True,
    description="Dataset totals equal the documentation once every split of a dataset is in "
    f"({documented_totals()}).",
)
def manifest_totals_match_documentation(
    unified_manifest: pd.DataFrame, datasets: DatasetsResource
) -> dg.AssetCheckResult:
    complete, pending = complete_datasets(unified_manifest)
    comparisons, found_by_dataset = {}, {}
    for key, rows in complete.items():
        found = manifest_totals(rows)
        total = datasets.source(key).expected_counts().total
        wanted = {m: v for m, v in total.items() if m in found or m.startswith("class_")}
        if not SOURCE_TYPES[key].has_boxes:
            wanted.pop("annotations", None)
        comparisons[key] = [
            CountComparison(f"{key}: {c.metric}", c.expected, c.found)
            for c in compare_counts(wanted, found)
        ]
        found_by_dataset[key] = found
    return figures_result(comparisons, datasets, pending, found_by_dataset)


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
    tops = (layout.IMAGES, layout.MASKS)
    listed = {f"{top}/{name}" for top in tops for name in listing(root / top)}
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
    return suite_result(InProcessValidation(), unified_manifest, "unified_manifest", LABEL_COLUMNS)


def shared_patients(rows: pd.DataFrame) -> dict[str, list[str]]:
    """Per pair of splits (`train/test`), the patient ids found in both."""
    known = rows.dropna(subset=["patient_id"])
    ids = {str(split): set(group["patient_id"]) for split, group in known.groupby("split")}
    return {
        f"{a}/{b}": sorted(ids[a] & ids[b])
        for a, b in combinations(sorted(ids), 2)
        if ids[a] & ids[b]
    }


@dg.asset_check(
    asset="unified_manifest",
    blocking=True,
    description="No patient_id in two splits of a dataset, for every pair of splits. Fails "
    "(blocking) for datasets whose documentation implies disjoint splits (ReXGradient: the "
    "patient total is the sum of the splits'); a warning for the others (ChestX-Det has no "
    "patient ids at all, so leakage there cannot be measured).",
)
def patients_disjoint_across_splits(unified_manifest: pd.DataFrame) -> dg.AssetCheckResult:
    leaks = {str(key): shared_patients(rows) for key, rows in unified_manifest.groupby("dataset")}
    leaks = {key: pairs for key, pairs in leaks.items() if pairs}
    blocking = [key for key in leaks if SOURCE_TYPES[key].patients_disjoint_across_splits]
    return dg.AssetCheckResult(
        passed=not leaks,
        severity=dg.AssetCheckSeverity.ERROR if blocking else dg.AssetCheckSeverity.WARN,
        metadata={
            "shared_patients": dg.MetadataValue.json(
                {k: {pair: len(ids) for pair, ids in v.items()} for k, v in leaks.items()}
            ),
            "examples": dg.MetadataValue.json(
                {k: {pair: ids[:10] for pair, ids in v.items()} for k, v in leaks.items()}
            ),
        },
        description="; ".join(
            f"{key}: {len(ids)} patient(s) in both {pair}"
            + (" (documented disjoint)" if key in blocking else "")
            for key, pairs in leaks.items()
            for pair, ids in pairs.items()
        )
        or "no patient is in two splits of a dataset",
    )
