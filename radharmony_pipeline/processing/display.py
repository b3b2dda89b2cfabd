"""Images as 8-bit grayscale for people to look at (contact sheets), from JPEG, PNG or DICOM.

Not the training decoder: it favours speed (JPEGs decoded at a reduced DCT scale close to
the display size) and a plain min–max display window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from .previews import display_gray


def display_pixels(path: Path, longest_side: int = 1024) -> np.ndarray:
    """2-D uint8 image with bone bright; JPEGs much larger than `longest_side` come smaller."""
    if path.suffix.lower() == ".dcm":
        return _dicom_display_pixels(path)
    with Image.open(path) as image:
        image.draft("L", (longest_side, longest_side))
        pixels = np.asarray(image)
    return display_gray(pixels[..., 0] if pixels.ndim == 3 else pixels)


def _dicom_display_pixels(path: Path) -> np.ndarray:
    import pydicom
    from pydicom.pixels import apply_modality_lut

    dataset = pydicom.dcmread(path)
    shown = display_gray(apply_modality_lut(dataset.pixel_array, dataset).astype(np.float64))
    if dataset.get("PhotometricInterpretation") == "MONOCHROME1":
        shown = 255 - shown
    return shown
