"""The corpus card and its Croissant file: figures computed from the data, every check listed,
validated by mlcroissant, and changed when the data changes."""

from __future__ import annotations

import csv
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from corpus import materialize_corpus

from radharmony_pipeline.definitions import build_definitions
from radharmony_pipeline.defs.jobs import CARD_JOB
from radharmony_pipeline.processing.corpus.card import CARD_NAME, CROISSANT_NAME, MANIFEST_FILE
from radharmony_pipeline.vocabulary import UNIFIED_LABELS, snake_case, unified_class

pytestmark = pytest.mark.build

PARTITIONS = ["ms_cxr.test", "chestx_det.test"]


def write_card(data: Path, output: Path, instance: dg.DagsterInstance) -> str:
    result = (
        build_definitions(data, output)
        .resolve_job_def(CARD_JOB)
        .execute_in_process(instance=instance)
    )
    assert result.success
    (event,) = result.get_asset_materialization_events()
    card = (output / CARD_NAME).read_text()
    assert event.materialization.metadata["card"].value == card  # shown in the UI as is
    return card


def prevalence_cell(manifest: pd.DataFrame, dataset: str, label: str) -> str:
    values = manifest.loc[manifest["dataset"] == dataset, f"label_{label}"]
    return f"{int((values == 1).sum())} / {int((values == 0).sum())} / {int(values.isna().sum())}"


def test_the_card_is_computed_from_the_data_and_follows_a_change(tiny_copy, tmp_path):
    import mlcroissant as mlc

    output = tmp_path / "output"
    instance = dg.DagsterInstance.ephemeral()
    _, built = materialize_corpus(tiny_copy, output, PARTITIONS, instance=instance)
    assert built.success
    before = write_card(tiny_copy, output, instance)
    manifest = pd.read_parquet(output / MANIFEST_FILE)

    for (dataset, split), rows in manifest.groupby(["dataset", "split"]):
        assert f"| {dataset} | {split} | {len(rows)} | {rows['patient_id'].nunique()} |" in before
    evaluations = {
        (data.asset_key.to_user_string(), data.check_name, data.partition)
        for run in instance.get_runs()
        for entry in instance.all_logs(
            run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
        for data in [entry.dagster_event.event_specific_data]
    }
    assert evaluations
    for asset, check, partition in evaluations:
        assert f"| {asset} | {check} | {partition or '—'} |" in before
    assert "apache-2.0" in before.lower() and "physionet" in before.lower()

    dataset = mlc.Dataset(jsonld=output / CROISSANT_NAME)  # raises on a validation error
    records = list(dataset.records(record_set="unified_manifest"))
    assert len(records) == len(manifest)

    # Relabel one MS-CXR test box to a category its image does not have yet.
    csv_path = next((tiny_copy / "ms-cxr").glob("*.csv"))
    with csv_path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    target = next(i for i, row in enumerate(rows) if row["split"] == "test")
    image_rows = [r for r in rows if r["dicom_id"] == rows[target]["dicom_id"]]
    present = {r["category_name"] for r in image_rows}
    categories = sorted({r["category_name"] for r in rows} - present)
    new = categories[0]
    rows[target]["category_name"] = new
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    label = unified_class(new)
    assert label in UNIFIED_LABELS, snake_case(new)

    _, rebuilt = materialize_corpus(tiny_copy, output, ["ms_cxr.test"], instance=instance)
    assert rebuilt.success
    after = write_card(tiny_copy, output, instance)
    changed = pd.read_parquet(output / MANIFEST_FILE)

    assert after != before
    new_cell = prevalence_cell(changed, "ms_cxr", label)
    assert prevalence_cell(manifest, "ms_cxr", label) != new_cell
    assert f"| {label} |" in after
    line = next(line for line in after.splitlines() if line.startswith(f"| {label} |"))
    datasets_in_card = sorted(changed["dataset"].unique())
    assert line.split(" | ")[1 + datasets_in_card.index("ms_cxr")].strip(" |") == new_cell
