"""`report_labels` materialized on the tiny datasets: ReXGradient's reports read by the labeler
(and not read again on a rerun), MS-CXR from MIMIC's CheXpert file when it is there, an empty
table with a note when it is not, and the checks and metadata of each."""

from __future__ import annotations

from importlib.metadata import version as metadata_version
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from radharmony_pipeline.definitions import defs
from radharmony_pipeline.defs.assets import report_labels as report_labels_asset
from radharmony_pipeline.defs.assets.source_files import source_files
from radharmony_pipeline.defs.resources import DatasetsResource, pipeline_resources
from radharmony_pipeline.processing.reports.labeler_version import (
    LABELER_VERSION,
    RULE_LIBRARIES,
    RULE_MODULES,
    labeler_version,
)
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.tables.table_schemas import (
    MIMIC_CHEXPERT,
    REPORT_LABEL_COLUMNS,
    REPORT_RULES,
)
from radharmony_pipeline.sources.mimic_chexpert import CHEXPERT_NAMES
from radharmony_pipeline.vocabulary import REPORT_OBSERVATIONS

pytestmark = pytest.mark.build
RULES = Path(report_labels_asset.__file__).parents[2] / "processing" / "reports"

_ASSETS = [d for d in defs.assets if not isinstance(d, dg.SourceAsset) and d is not source_files]
# The index and labels without their suites (GX), then the report labels with their checks.
SELECTION = dg.AssetSelection.assets("raw_index", "labels").without_checks() | (
    dg.AssetSelection.assets("report_labels")
)


def materialize(data_root: Path, output: Path, partition: str) -> dg.ExecuteInProcessResult:
    result = dg.materialize(
        _ASSETS,
        partition_key=partition,
        resources={
            **pipeline_resources(data_root, output),
            "datasets": DatasetsResource(data_root=str(data_root)),
        },
        selection=SELECTION,
        raise_on_error=False,
    )
    assert result.success, partition
    return result


def metadata(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    (event,) = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey("report_labels")
    ]
    return {name: value.value for name, value in event.materialization.metadata.items()}


def checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def read(output: Path, name: str, partition: str) -> pd.DataFrame:
    return pd.read_parquet(layout.table_file(output, name, partition))


def built(data_root: Path, output: Path, partition: str):
    """The partition's index, labels and report labels: (the run's result, the index's,
    the labels' and the report labels' tables)."""
    result = materialize(data_root, output, partition)
    names = ("raw_index", "labels", "report_labels")
    return result, *(read(output, name, partition) for name in names)


def test_rexgradient_reports_are_read_once_and_reused_on_a_rerun(tiny_root, tmp_path):
    partition, output = "rexgradient.test", tmp_path / "output"
    first, _, labels, table = built(tiny_root, output, partition)
    with_report = labels.loc[labels["report"].notna(), "image_id"]
    assert len(with_report) > 0
    assert table["image_id"].tolist() == with_report.tolist()
    assert set(table["report_label_source"]) == {REPORT_RULES}
    assert set(table["dataset"]) == {"rexgradient"} and set(table["split"]) == {"test"}
    found = metadata(first)
    distinct = labels["report"].dropna().nunique()
    assert found["distinct_reports"] == distinct == table["report_sha256"].nunique()
    assert (found["labelled"], found["reused"]) == (distinct, 0)
    # The synthetic reports name findings: some positive and some negative labels.
    assert table[list(REPORT_LABEL_COLUMNS)].eq(1).any().any()
    assert table[list(REPORT_LABEL_COLUMNS)].eq(0).any().any()
    # Evidence for every positive and uncertain label, naming its observation.
    decided = table[list(REPORT_LABEL_COLUMNS)].isin([1, -1]).to_numpy()
    for position, evidence in enumerate(table["report_label_evidence"]):
        named = {e["observation"] for e in evidence}
        for name, is_decided in zip(REPORT_OBSERVATIONS, decided[position], strict=True):
            assert not is_decided or name == "no_finding" or name in named
    # One entry per observation, whatever the number of images.
    assert set(found["prevalence"]) == set(REPORT_OBSERVATIONS)
    assert checks(first) == {
        "report_labels_cover_reports": True,
        "unmentioned_reports_within_limit": True,
    }

    again = metadata(materialize(tiny_root, output, partition))
    assert (again["labelled"], again["reused"]) == (0, distinct)
    pd.testing.assert_frame_equal(read(output, "report_labels", partition), table)


def test_ms_cxr_gets_mimics_chexpert_labels_per_study(tiny_root, tmp_path):
    result, index, boxes, table = built(tiny_root, tmp_path / "output", "ms_cxr.train")
    assert table["image_id"].tolist() == index["image_id"].tolist()
    assert set(table["report_label_source"]) == {MIMIC_CHEXPERT}
    assert table["report_sha256"].isna().all()
    assert all(len(evidence) == 0 for evidence in table["report_label_evidence"])
    # The synthetic file marks each study's grounded categories positive.
    grounded_any = False
    for column in ("label_pleural_effusion", "label_cardiomegaly", "label_edema"):
        grounded = boxes[column].eq(1).fillna(False).to_numpy(dtype=bool)
        grounded_any |= grounded.any()
        assert table[f"report_{column}"][grounded].eq(1).all()
    assert grounded_any
    found = metadata(result)
    assert found["report_label_file"].endswith(CHEXPERT_NAMES[0])
    assert found["images_without_study_labels"] == 0
    assert all(checks(result).values())


def test_ms_cxr_without_the_file_has_an_empty_table_saying_why(tiny_copy, tmp_path):
    (tiny_copy / "mimic-cxr" / CHEXPERT_NAMES[0]).unlink()
    result = materialize(tiny_copy, tmp_path / "output", "ms_cxr.test")
    assert read(tmp_path / "output", "report_labels", "ms_cxr.test").empty
    assert "no report label file" in metadata(result)["note"]
    assert all(checks(result).values())


def test_a_dataset_without_reports_has_an_empty_table(tiny_root, tmp_path):
    result = materialize(tiny_root, tmp_path / "output", "chestx_det.test")
    assert read(tmp_path / "output", "report_labels", "chestx_det.test").empty
    assert "has no reports" in metadata(result)["note"]


def test_a_changed_phrase_rereads_every_report_at_the_next_run(tiny_root, tmp_path, monkeypatch):
    partition = "rexgradient.test"
    output = tmp_path / "output"
    first = metadata(materialize(tiny_root, output, partition))
    assert first["labeler_version"] == LABELER_VERSION
    # The version of the same rules with one phrase list edited.
    texts = {name: (RULES / name).read_text() for name in RULE_MODULES}
    texts["phrases.py"] = texts["phrases.py"].replace('"cardiomegally",', '"cardiomegaly!",')
    libraries = {name: metadata_version(name) for name in RULE_LIBRARIES}
    edited = labeler_version(texts, libraries)
    assert edited != LABELER_VERSION
    monkeypatch.setattr(report_labels_asset, "LABELER_VERSION", edited)
    again = metadata(materialize(tiny_root, output, partition))
    assert (again["labelled"], again["reused"]) == (first["distinct_reports"], 0)
    assert set(read(output, "report_labels", partition)["report_labeler_version"]) == {edited}
