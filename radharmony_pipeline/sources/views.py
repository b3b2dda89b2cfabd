"""Normalization of the view-position spellings found in the datasets' metadata."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

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
    text = raw.astype("string")
    # A split has a handful of distinct spellings but up to 239k images (ReXGradient train):
    # normalize each spelling once, then spread the results in C.
    codes, spellings = pd.factorize(text, use_na_sentinel=True)
    normalized = _normalized(pd.Series(spellings, dtype="string")).tolist()
    # Nulls (code -1) take the entry after the spellings: UNKNOWN.
    positions = np.where(codes < 0, len(normalized), codes)
    lookup = pa.array([*normalized, "UNKNOWN"], type=pa.large_string())
    result = pd.arrays.ArrowStringArray(lookup.take(positions))
    return pd.Series(result, index=raw.index, copy=False).astype("string")


def _normalized(spellings: pd.Series) -> pd.Series:
    cleaned = spellings.str.strip().str.upper().str.replace(" ", "_", regex=False)
    mapped = cleaned.map(_VIEW_SYNONYMS, na_action="ignore")
    result = mapped.where(mapped.notna(), "OTHER")
    return result.where(cleaned.notna(), "UNKNOWN").astype("string")
