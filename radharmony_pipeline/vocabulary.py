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

# The observation columns of CheXpert's labels (its labeler's, and the files that follow it:
# CheXpert, CheXlocalize, MIMIC-CXR-JPG), as CheXpert spells them.
CHEXPERT_COLUMNS: tuple[str, ...] = (
    "No Finding",
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)

# A report label's values (CheXpert's): null means the observation is not mentioned.
POSITIVE, NEGATIVE, UNCERTAIN = 1, 0, -1
REPORT_LABEL_VALUES: tuple[int, ...] = (POSITIVE, NEGATIVE, UNCERTAIN)
# The label that a read report without any positive or uncertain finding takes.
NO_FINDING = "no_finding"

# The unified classes the report labeler reads from report text (the report_label_* columns):
# every class but diffuse nodules, which reports do not tell apart from nodules. Here, not in
# the labeler, so that declaring the columns does not import spaCy.
REPORT_OBSERVATIONS: tuple[str, ...] = tuple(
    name for name in UNIFIED_LABELS if name != "diffuse_nodule"
)

# The mask class of an image's union mask (every class's pixels together): a `mask_class`
# value beside the unified classes.
UNION_CLASS = "any"
# A row's `status`: usable, or kept as an error row whose `error` column says why.
STATUS_OK = "ok"
STATUS_ERROR = "error"
ROW_STATUSES: tuple[str, ...] = (STATUS_OK, STATUS_ERROR)

# Normalized values every table uses.
SPLITS: tuple[str, ...] = ("train", "val", "test")
VIEW_POSITIONS: tuple[str, ...] = ("PA", "AP", "LATERAL", "LL", "OTHER", "UNKNOWN")
# Source image formats by file suffix (lower case): the one table of known extensions.
FORMAT_BY_SUFFIX: dict[str, str] = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".dcm": "dcm"}
IMAGE_FORMATS: tuple[str, ...] = tuple(dict.fromkeys(FORMAT_BY_SUFFIX.values()))


def suffixes_of(image_format: str) -> frozenset[str]:
    """The file suffixes of one source format: `jpg` -> {".jpg", ".jpeg"}."""
    return frozenset(s for s, f in FORMAT_BY_SUFFIX.items() if f == image_format)


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
