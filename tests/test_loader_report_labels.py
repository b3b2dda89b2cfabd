"""ManifestDataset's `labels=` and `uncertain=` choices on a small hand-made manifest: what
fills `cls`, what an uncertain report label becomes, and that a null never becomes 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from radharmony_pipeline import loader
from radharmony_pipeline.loader import ManifestDataset
from radharmony_pipeline.processing.tables.manifest import REPORT_MANIFEST_COLUMNS
from radharmony_pipeline.processing.tables.table_schemas import UNIFIED_MANIFEST, pandas_dtype
from radharmony_pipeline.vocabulary import UNIFIED_LABELS

NAN = np.nan
# Per image: its annotations (label_*), its report labels (report_label_*) and their source.
IMAGES = {
    # Annotated by its dataset, no report labels.
    "chexlocalize/a": ({"pleural_effusion": 1, "edema": 0}, {}, None),
    # Report labels only.
    "rexgradient/b": ({}, {"pleural_effusion": 1, "edema": -1, "pneumothorax": 0}, "report_rules"),
    # Both: the annotation of edema disagrees with the report; cardiomegaly only reported.
    "ms_cxr/c": ({"edema": 0}, {"edema": 1, "cardiomegaly": -1}, "mimic_chexpert"),
}


def cls_of(dataset: ManifestDataset) -> dict[str, dict[str, float]]:
    """Per image, its `cls` by class name."""
    return {
        dataset[i]["image_id"]: dict(zip(UNIFIED_LABELS, dataset[i]["cls"].tolist(), strict=True))
        for i in range(len(dataset))
    }


@pytest.fixture(autouse=True)
def numpy_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "torch", None)


@pytest.fixture
def output_root(tmp_path: Path) -> Path:
    root = tmp_path / "output"
    (root / "images").mkdir(parents=True)
    for image_id in IMAGES:
        path = root / "images" / f"{image_id.replace('/', '__')}.png"
        Image.fromarray(np.zeros((4, 4), dtype=np.uint8)).save(path)
    return root


@pytest.fixture
def manifest() -> pd.DataFrame:
    """Every declared manifest column, null unless an image says otherwise."""
    n = len(IMAGES)
    frame = pd.DataFrame(
        {
            c.name: pd.Series([None] * n, dtype=pandas_dtype(c.type))
            for c in UNIFIED_MANIFEST.columns
            if c.name in loader.PARTITION_MANIFEST_COLUMNS
        }
    )
    frame["image_id"] = list(IMAGES)
    frame["dataset"] = [image_id.split("/")[0] for image_id in IMAGES]
    frame["split"] = "train"
    frame["image_path"] = [f"images/{i.replace('/', '__')}.png" for i in IMAGES]
    frame["has_mask"] = False
    for column in ("bboxes", "bboxes_resized", "bbox_labels", "label_text", "mask_classes"):
        frame[column] = [[] for _ in range(n)]
    for position, (annotated, reports, source) in enumerate(IMAGES.values()):
        for name, value in annotated.items():
            frame.loc[position, f"label_{name}"] = value
        for name, value in reports.items():
            frame.loc[position, f"report_label_{name}"] = value
        frame.loc[position, "report_label_source"] = source
    return frame


def test_annotations_are_the_default_and_ignore_the_reports(manifest, output_root):
    found = cls_of(ManifestDataset(manifest, output_root=output_root))
    assert found["chexlocalize/a"]["pleural_effusion"] == 1
    assert found["chexlocalize/a"]["edema"] == 0
    assert np.isnan(list(found["rexgradient/b"].values())).all()
    assert found["ms_cxr/c"]["edema"] == 0
    assert np.isnan(found["ms_cxr/c"]["cardiomegaly"])


@pytest.mark.parametrize(("uncertain", "value"), [("ignore", NAN), ("zeros", 0.0), ("ones", 1.0)])
def test_report_labels_with_each_uncertainty_policy(manifest, output_root, uncertain, value):
    found = cls_of(
        ManifestDataset(manifest, output_root=output_root, labels="reports", uncertain=uncertain)
    )
    b = found["rexgradient/b"]
    assert b["pleural_effusion"] == 1
    assert b["pneumothorax"] == 0
    np.testing.assert_equal(b["edema"], value)
    # Not mentioned stays unknown whatever the policy: a null never becomes 0.
    assert np.isnan(b["atelectasis"])
    # A class the report labeler does not read, and an image without report labels.
    assert np.isnan(b["diffuse_nodule"])
    assert np.isnan(list(found["chexlocalize/a"].values())).all()
    assert found["ms_cxr/c"]["edema"] == 1


@pytest.mark.parametrize(("uncertain", "value"), [("ignore", NAN), ("zeros", 0.0), ("ones", 1.0)])
def test_both_takes_the_annotation_where_there_is_one_else_the_report(
    manifest, output_root, uncertain, value
):
    found = cls_of(
        ManifestDataset(manifest, output_root=output_root, labels="both", uncertain=uncertain)
    )
    assert found["chexlocalize/a"]["pleural_effusion"] == 1
    assert found["rexgradient/b"]["pleural_effusion"] == 1
    assert found["ms_cxr/c"]["edema"] == 0  # the annotation wins over the report's 1
    np.testing.assert_equal(found["ms_cxr/c"]["cardiomegaly"], value)
    np.testing.assert_equal(found["rexgradient/b"]["edema"], value)
    assert np.isnan(found["ms_cxr/c"]["atelectasis"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"labels": "report"}, "labels must be one of 'annotations', 'reports', 'both'"),
        ({"uncertain": "zero"}, "uncertain must be one of 'ignore', 'zeros', 'ones'"),
    ],
)
def test_a_bad_choice_is_a_clear_error(manifest, output_root, options, message):
    with pytest.raises(ValueError, match=message):
        ManifestDataset(manifest, output_root=output_root, **options)


def test_a_manifest_without_report_labels_still_loads_its_annotations(manifest, output_root):
    older = manifest.drop(columns=list(REPORT_MANIFEST_COLUMNS))
    found = cls_of(ManifestDataset(older, output_root=output_root))
    assert found["chexlocalize/a"]["pleural_effusion"] == 1
    with pytest.raises(ValueError, match="report_label_"):
        ManifestDataset(older, output_root=output_root, labels="reports")
