"""A metadata file of the wrong shape fails naming the file, where in it, and the fix."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from radharmony_pipeline.sources import SourceError
from radharmony_pipeline.sources.base import fail_at_first_bad_row, identity_counts
from radharmony_pipeline.sources.mimic_splits import read_official_splits
from radharmony_pipeline.sources.ms_cxr import CSV_NAME


@pytest.mark.parametrize(
    ("dataset", "wrong_top_level", "expected"),
    [
        ("chestx_det", {"image": "x.png"}, "expected a JSON list of image entries"),
        ("rexgradient", [{"ImagePath": ["x.png"]}], "expected an object keyed by study"),
    ],
)
def test_an_annotation_json_of_the_wrong_shape_names_file_and_fix(
    open_tiny, tiny_copy, dataset, wrong_top_level, expected
):
    source = open_tiny(dataset, tiny_copy)
    path = source.annotation_files("train")[0]
    path.write_text(json.dumps(wrong_top_level))
    with pytest.raises(SourceError) as caught:
        source.read_split("train")
    message = str(caught.value)
    assert str(path) in message and "top level" in message and expected in message
    assert "from the" in message and "download" in message


def test_a_segmentation_json_of_the_wrong_shape_names_file_and_fix(open_tiny, tiny_copy):
    source = open_tiny("chexlocalize", tiny_copy)
    path = source.segmentation_json("val")
    path.write_text("[1, 2]")
    with pytest.raises(SourceError, match=r"top level.*an object keyed by cxr_id.*Use gt_segm"):
        source.read_segmentations("val")


def test_an_ms_cxr_row_with_an_unknown_split_is_named_by_its_csv_line(open_tiny, tiny_copy):
    csv = tiny_copy / "ms-cxr" / CSV_NAME
    table = pd.read_csv(csv, dtype=str)
    table.loc[3, "split"] = "training"
    table.to_csv(csv, index=False)
    with pytest.raises(SourceError, match=r"row 5: split 'training' is not train, val or test"):
        open_tiny("ms_cxr", tiny_copy).read_split("train")


def test_an_official_split_file_with_an_unknown_split_is_named_by_its_line(tmp_path):
    path = tmp_path / "mimic-cxr-2.0.0-split.csv"
    path.write_text("dicom_id,study_id,subject_id,split\na,1,2,train\nb,3,4,valid\n")
    with pytest.raises(SourceError, match=r"row 3: split 'valid' is not one of train, validate"):
        read_official_splits(path)


def test_the_first_bad_row_only_is_named_and_no_bad_row_passes(tmp_path):
    path = tmp_path / "x.csv"
    fail_at_first_bad_row(pd.Series([False, False]), path, lambda row: "never", "fix")
    with pytest.raises(SourceError, match=r"x.csv: row 3: value 1 is bad\. Mend it"):
        fail_at_first_bad_row(
            pd.Series([False, True, True]), path, lambda row: f"value {row} is bad", "Mend it"
        )


def test_identity_counts_count_distinct_patients_and_studies():
    index = pd.DataFrame({"patient_id": ["p1", "p1", "p2"], "study_id": ["s1", "s2", "s2"]})
    assert identity_counts(index) == {"images": 3, "patients": 2, "studies": 2}
