"""The unified 21-class label vocabulary and the mappings of each dataset's names onto it."""

from __future__ import annotations

import re

UNIFIED_LABELS: tuple[str, ...] = (
    "atelectasis",
    "calcification",
    "cardiomegaly",
    "consolidation",
    "diffuse_nodule",
    "edema",
    "emphysema",
    "enlarged_cardiomediastinum",
    "fibrosis",
    "fracture",
    "lung_lesion",
    "lung_opacity",
    "mass",
    "no_finding",
    "nodule",
    "pleural_effusion",
    "pleural_other",
    "pleural_thickening",
    "pneumonia",
    "pneumothorax",
    "support_devices",
)

LABEL_COLUMNS: tuple[str, ...] = tuple(f"label_{name}" for name in UNIFIED_LABELS)

# Normalized values every table uses.
SPLITS: tuple[str, ...] = ("train", "val", "test")
VIEW_POSITIONS: tuple[str, ...] = ("PA", "AP", "LATERAL", "LL", "OTHER", "UNKNOWN")
IMAGE_FORMATS: tuple[str, ...] = ("jpg", "png", "dcm")
# The raw_index contract's columns, in order (datasets may add documented extras after them).
INDEX_COLUMNS: tuple[str, ...] = (
    "image_id",
    "image_key",
    "dataset",
    "split",
    "patient_id",
    "study_id",
    "image_path",
    "image_format",
    "view_position",
    "view_position_raw",
    "source_height",
    "source_width",
)

# Names whose snake_case form is not already a unified name.
_SYNONYMS = {
    "airspace_opacity": "lung_opacity",
    "effusion": "pleural_effusion",
}


def snake_case(name: str) -> str:
    """`Pleural Effusion` -> `pleural_effusion`, `Enlarged Cardiomediastinum` -> ..."""
    return re.sub(r"[^0-9a-z]+", "_", name.strip().lower()).strip("_")


def unified_class(native_name: str) -> str:
    """Map a dataset's class name onto the unified vocabulary, or raise naming the class."""
    key = snake_case(native_name)
    key = _SYNONYMS.get(key, key)
    if key not in UNIFIED_LABELS:
        raise KeyError(
            f"class name {native_name!r} has no entry in the unified vocabulary "
            f"({', '.join(UNIFIED_LABELS)})"
        )
    return key
