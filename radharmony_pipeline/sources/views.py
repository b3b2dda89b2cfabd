"""Normalization of the view-position spellings found in the datasets' metadata."""

from __future__ import annotations

import pandas as pd

VIEW_POSITIONS: tuple[str, ...] = ("PA", "AP", "LATERAL", "LL", "OTHER", "UNKNOWN")

_VIEW_SYNONYMS = {
    "PA": "PA",
    "POSTERO_ANTERIOR": "PA",
    "POSTEROANTERIOR": "PA",
    "AP": "AP",
    "ANTERO_POSTERIOR": "AP",
    "ANTEROPOSTERIOR": "AP",
    "AP_SUPINE": "AP",
    "LATERAL": "LATERAL",
    "LAT": "LATERAL",
    "RL": "LATERAL",
    "LL": "LL",
    "LEFT_LATERAL": "LL",
    # CheXpert file names say frontal or lateral; a frontal film's projection is then unknown.
    "FRONTAL": "UNKNOWN",
    "UNKNOWN": "UNKNOWN",
    "N/A": "UNKNOWN",
    "NA": "UNKNOWN",
    "": "UNKNOWN",
}


def normalize_view_positions(raw: pd.Series) -> pd.Series:
    """Map raw view strings onto VIEW_POSITIONS; nulls become UNKNOWN, unlisted views OTHER.

    `AP (KUB)`, `LAO` and `RAO` land in OTHER: they are not standard chest projections, and a
    user filtering for AP/PA chest films must not receive them.
    """
    cleaned = raw.astype("string").str.strip().str.upper().str.replace(" ", "_", regex=False)
    mapped = cleaned.map(_VIEW_SYNONYMS, na_action="ignore")
    result = mapped.where(mapped.notna(), "OTHER")
    return result.where(cleaned.notna(), "UNKNOWN").astype("string")
