"""Checks against the parent datasets' official splits: evaluation images a parent trains on,
training images a parent tests on, and ChestX-Det patients on both sides of its own split.
Warnings unless RADHARMONY_PARENT_LEAKS=block; a parent that is not configured never passes."""

from collections.abc import Callable

import dagster as dg
import pandas as pd

from ...processing.corpus.parents import (
    MATCH_KINDS,
    PARENTS,
    ParentLeaks,
    eval_images_in_parent_train,
    eval_patients_in_parent_train,
    match_counts,
    patients_across_own_splits,
    train_images_in_parent_test,
)
from ..assets.parents import NOT_CONFIGURED, parent_file_versions
from ..resources import DatasetsResource
from ..run_settings import RunSettingsResource

_DROP_LEAKS = "ManifestDataset(..., drop_parent_train_leaks=True)"


def _result(
    leaks: ParentLeaks, hint: str, datasets: DatasetsResource, block: bool, what: str
) -> dg.AssetCheckResult:
    found = len(leaks.images)
    unconfigured = leaks.unconfigured
    severity = dg.AssetCheckSeverity.ERROR if found and block else dg.AssetCheckSeverity.WARN
    parts = [f"{found} {what}" + (f": {leaks.per_pair}" if found else "")]
    if unconfigured:
        parts.append(
            f"{NOT_CONFIGURED} for {', '.join(sorted(unconfigured))}: "
            + "; ".join(unconfigured[k] for k in sorted(unconfigured))
        )
    return dg.AssetCheckResult(
        passed=not found and not unconfigured,
        severity=severity,
        metadata={
            "images": found,
            "per_split_pair": dg.MetadataValue.json(leaks.per_pair),
            "examples": dg.MetadataValue.json(leaks.examples),
            "coverage": dg.MetadataValue.json(leaks.coverage),
            "hint": hint,
            "parent_files": dg.MetadataValue.json(parent_file_versions(datasets)),
            "parent_split_names": dg.MetadataValue.json(
                {
                    parent.key: {
                        "train": sorted(parent.train_splits),
                        "test": sorted(parent.test_splits),
                    }
                    for parent in PARENTS.values()
                }
            ),
        },
        description="; ".join(parts),
    )


def _leak_check(
    name: str, description: str, find: Callable[[pd.DataFrame], ParentLeaks], what: str, hint: str
) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset="parent_provenance", name=name, blocking=True, description=description)
    def check(
        parent_provenance: pd.DataFrame,
        datasets: DatasetsResource,
        run_settings: RunSettingsResource,
    ) -> dg.AssetCheckResult:
        block = run_settings.parent_leaks_block()
        return _result(find(parent_provenance), hint, datasets, block, what)

    return check


eval_images_in_parent_train_split = _leak_check(
    "eval_images_in_parent_train_split",
    "Evaluation images (val/test) that are in their parent's official training split "
    "(MIMIC-CXR train, NIH train_val): pretraining on that split sees them.",
    eval_images_in_parent_train,
    "evaluation images are in their parent's training split",
    "Pretraining on the parent's training split sees these evaluation images: leave them "
    f"out with {_DROP_LEAKS}, or pretrain without them.",
)

eval_patients_in_parent_train_split = _leak_check(
    "eval_patients_in_parent_train_split",
    "Evaluation images whose parent patient has images in the parent's official training "
    "split: another film of the same patient is seen in pretraining.",
    eval_patients_in_parent_train,
    "evaluation images belong to patients with images in their parent's training split",
    "Patient-level leak: the parent's training split holds other films of these patients. "
    "Leave them out with ManifestDataset(..., drop_parent_patient_leaks=True).",
)

train_images_in_parent_test_split = _leak_check(
    "train_images_in_parent_test_split",
    "Training images that are in their parent's official test split: a model trained here "
    "and evaluated on the parent's test split has seen them.",
    train_images_in_parent_test,
    "training images are in their parent's test split",
    "Do not evaluate on the parent's test split after training on these images, or leave "
    "them out of training (filter on parent_split).",
)


@dg.asset_check(
    asset="parent_provenance",
    blocking=True,
    description="ChestX-Det patients (recovered through NIH ChestX-ray14) with images in both "
    "its train and its test split: its split is by image, so its card calls this likely but "
    "unrepairable.",
)
def chestx_det_patients_across_splits(
    parent_provenance: pd.DataFrame, datasets: DatasetsResource, run_settings: RunSettingsResource
) -> dg.AssetCheckResult:
    leaks = patients_across_own_splits(parent_provenance, "chestx_det")
    return _result(
        leaks,
        "ChestX-Det's test split shares patients with its train split: keep it patient-"
        "disjoint with ManifestDataset(..., patient_disjoint_parents=True) (drops the test "
        "images of shared patients).",
        datasets,
        run_settings.parent_leaks_block(),
        "ChestX-Det images belong to patients in both its train and test split",
    )


@dg.asset_check(
    asset="nih_parent_links",
    description="Every ChestX-Det image found in NIH ChestX-ray14: matched, ambiguous "
    "(several NIH candidates) and unmatched counts; warns unless all are matched.",
)
def chestx_det_images_found_in_nih(nih_parent_links: pd.DataFrame) -> dg.AssetCheckResult:
    if nih_parent_links.empty:
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"parent": NOT_CONFIGURED, "hint": PARENTS["nih_chestxray14"].configure},
            description=f"{NOT_CONFIGURED}: no NIH ChestX-ray14 fingerprints to match against "
            f"({PARENTS['nih_chestxray14'].configure})",
        )
    counts = match_counts(nih_parent_links)
    missing = nih_parent_links[nih_parent_links["match"].isin(["ambiguous", "unmatched"])]
    return dg.AssetCheckResult(
        passed=missing.empty,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            **{kind: counts[kind] for kind in (*MATCH_KINDS, "matched", "sharing_a_parent")},
            "not_matched": dg.MetadataValue.json(
                dict(zip(missing["image_id"].head(20), missing["match"].head(20), strict=True))
            ),
            "hint": "Unmatched: not in this NIH download (or cropped/edited beyond the radius); "
            "ambiguous: NIH holds several copies; either way the parent columns stay null.",
        },
        description=f"{counts['matched']} matched, {counts['ambiguous']} ambiguous, "
        f"{counts['unmatched']} unmatched of {len(nih_parent_links)} ChestX-Det images",
    )
