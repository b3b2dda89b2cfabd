"""Per-image error messages grouped by reason, for metadata a person can scan."""

from __future__ import annotations

import pandas as pd


def error_reasons(messages: pd.Series) -> dict[str, int]:
    """Count messages by reason: the text after the file name, with numbers masked, so
    "a.png: 12 pixels differ" and "b.png: 7 pixels differ" count as one reason."""
    reasons = messages.astype(str).str.split(": ", n=1).str[-1]
    reasons = reasons.str.replace(r"\d+", "N", regex=True)
    return {str(k): int(v) for k, v in reasons.value_counts().items()}


def error_causes(messages: pd.Series) -> dict[str, int]:
    """Count messages by cause: like error_reasons, with quoted text and paths masked too,
    so one decoder error that names each file counts as one cause."""
    reasons = messages.astype(str).str.split(": ", n=1).str[-1]
    reasons = reasons.str.replace(r"'[^']*'|\"[^\"]*\"", "'…'", regex=True)
    reasons = reasons.str.replace(r"\S*/\S*", "…", regex=True)
    reasons = reasons.str.replace(r"\d+", "N", regex=True)
    return {str(k): int(v) for k, v in reasons.value_counts().items()}
