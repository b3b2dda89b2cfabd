"""Agreement between two sets of report labels, scored as the CheXpert paper scores its
labeler: mention, negation and uncertainty F1 (plus positive and no-finding F1), micro-averaged
over every (text, observation) pair."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.reports.label_files import LabelFileError, label_columns
from radharmony_pipeline.vocabulary import (
    NEGATIVE,
    NO_FINDING,
    POSITIVE,
    REPORT_LABEL_VALUES,
    REPORT_OBSERVATIONS,
    UNCERTAIN,
)

if TYPE_CHECKING:
    from radharmony_pipeline.processing.reports.labeler import ReportReading

AGREEMENT_SCORES = ("mention_f1", "negation_f1", "uncertainty_f1", "positive_f1", "no_finding_f1")
PAIRS = "pairs"
_NULL = -9  # "not mentioned" while the labels sit in one integer array


def agreement_scores(predicted: pd.DataFrame, reference: pd.DataFrame) -> dict[str, float]:
    """The five scores of `predicted` against `reference` (rows in the same order, one column
    per observation, 1 / 0 / -1 / null) and the number of (text, observation) pairs scored.

    The observations are the `reference` columns that are report observations; no finding
    has its own score (positive F1 on that column) and stays out of the other four. A score
    with nothing to score (no pair of its class on either side) is NaN."""
    if len(predicted) != len(reference):
        raise ValueError(
            f"predicted labels have {len(predicted)} rows, the reference {len(reference)}: "
            "pass both frames with one row per text, in the same order"
        )
    observations = [c for c in reference.columns if c in REPORT_OBSERVATIONS]
    missing = [c for c in observations if c not in predicted.columns]
    if missing:
        raise ValueError(f"predicted labels lack the reference's columns {missing}")
    findings = [c for c in observations if c != NO_FINDING]
    truth = _label_array(reference, findings, "reference")
    guess = _label_array(predicted, findings, "predicted")
    scores = {
        "mention_f1": _f1(truth != _NULL, guess != _NULL),
        "negation_f1": _f1(truth == NEGATIVE, guess == NEGATIVE),
        "uncertainty_f1": _f1(truth == UNCERTAIN, guess == UNCERTAIN),
        "positive_f1": _f1(truth == POSITIVE, guess == POSITIVE),
    }
    if NO_FINDING in observations:
        truth_nf = _label_array(reference, [NO_FINDING], "reference")
        guess_nf = _label_array(predicted, [NO_FINDING], "predicted")
        scores["no_finding_f1"] = _f1(truth_nf == POSITIVE, guess_nf == POSITIVE)
    else:
        scores["no_finding_f1"] = math.nan
    scores[PAIRS] = int(truth.size)
    return scores


def positive_scores(
    predicted: pd.DataFrame, gold: pd.DataFrame
) -> dict[str, dict[str, dict[str, float]]]:
    """Precision, recall and F1 of positive labels against positive-only gold labels (1
    present, anything else absent), per column of `gold` and micro over all of them: once
    with positives only (as the ChestX-ray8 paper scores a labeler) and once counting
    uncertain as positive."""
    truth = gold.fillna(0).to_numpy(dtype=np.int64) == POSITIVE
    said = predicted[list(gold.columns)].astype("Int8").fillna(_NULL).to_numpy(dtype=np.int64)
    readings = {"positive": said == POSITIVE, "positive_or_uncertain": np.isin(said, [1, -1])}
    scores: dict[str, dict[str, dict[str, float]]] = {}
    for name, column in [*((c, i) for i, c in enumerate(gold.columns)), ("micro", None)]:
        picked = slice(None) if column is None else column
        scores[name] = {
            kind: _precision_recall(truth[:, picked], guess[:, picked])
            for kind, guess in readings.items()
        }
    return scores


def _precision_recall(truth: np.ndarray, guess: np.ndarray) -> dict[str, float]:
    hits = int(np.sum(truth & guess))
    precision = hits / int(guess.sum()) if guess.any() else math.nan
    recall = hits / int(truth.sum()) if truth.any() else math.nan
    return {"precision": precision, "recall": recall, "f1": _f1(truth, guess)}


def _label_array(frame: pd.DataFrame, columns: list[str], side: str) -> np.ndarray:
    """The columns as integers, null as _NULL; any other value is an error naming it."""
    values = frame[columns].apply(pd.to_numeric, errors="coerce")
    for column in columns:
        original = frame[column]
        bad = original.notna() & ~values[column].isin(list(REPORT_LABEL_VALUES))
        if bad.any():
            row = bad.to_numpy().nonzero()[0][0]
            raise ValueError(
                f"{side} labels, column {column!r}, row {row}: {original.iloc[row]!s} is not "
                "1, 0, -1 or blank"
            )
    return values.fillna(_NULL).to_numpy(dtype=np.int64)


def _f1(truth: np.ndarray, guess: np.ndarray) -> float:
    true_positive = int(np.sum(truth & guess))
    wrong = int(np.sum(truth ^ guess))
    if true_positive + wrong == 0:
        return math.nan
    return 2 * true_positive / (2 * true_positive + wrong)


def format_agreement(scores: Mapping[str, float]) -> str:
    """The scores as printable lines, one per score, then the number of pairs."""
    lines = [
        f"{name.removesuffix('_f1').replace('_', ' ') + ' F1':<18} {scores[name]:.3f}"
        for name in AGREEMENT_SCORES
    ]
    if PAIRS in scores:
        lines.append(f"{'(text, observation) pairs':<18} {int(scores[PAIRS])}")
    return "\n".join(lines)


def reading_labels(readings: Sequence[ReportReading]) -> pd.DataFrame:
    """One row per reading, one nullable Int8 column per report observation."""
    return pd.DataFrame(
        {
            name: pd.array([r.labels[name] for r in readings], dtype="Int8")
            for name in REPORT_OBSERVATIONS
        }
    )


def read_labelled_reports(path: str | Path) -> tuple[list[str], pd.DataFrame]:
    """A labelled set's texts and reference labels from a CSV with `id`, `text` and observation
    columns (CheXpert's names or ours; 1 / 0 / -1 / blank)."""
    frame = pd.read_csv(path, dtype="string", keep_default_na=False, na_values=[""])
    missing = [c for c in ("id", "text") if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{path}: no column {missing[0]!r}; a labelled set has `id`, `text` "
            "and one column per observation"
        )
    try:
        labels = label_columns(frame.drop(columns=["id", "text"]))
    except LabelFileError as error:
        raise ValueError(f"{path}: {error}") from None
    return frame["text"].fillna("").tolist(), labels
