"""Facts about radiograph files (size, grayscale pixels), decoding as little as possible."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image

from .source_store import (
    NotARegularFile,
    SourcePath,
    SourceStoreError,
    as_source_path,
    is_remote,
    key_problem,
    open_source_file,
    readable,
    require_regular_file,
)

PILLOW_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}
DICOM_SUFFIX = ".dcm"
UINT16_MAX = np.iinfo(np.uint16).max


class ImageFileError(ValueError):
    """An image file is missing, unreadable, or not in a form the pipeline accepts."""

    def __init__(self, path: SourcePath, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


# --- confinement -----------------------------------------------------------------------------


def confined(path: SourcePath, root: SourcePath | None) -> SourcePath:
    """`path`, after checking that its real path (symlinks resolved) stays inside `root`.

    Metadata paths are confined by text when read; a symlink inside the image tree can still
    point anywhere, so every reader checks the resolved path right before opening. Nothing
    is opened here. `root` None means the caller has no image folder to confine to. An
    object's key is checked as text instead (see source_store.key_problem).
    """
    path = as_source_path(path)
    if root is None:
        return path
    if is_remote(path) or is_remote(root):
        problem = key_problem(path, root)
        if problem is not None:
            raise ImageFileError(path, f"{problem}; the file was not read")
        return path
    try:
        real = Path(os.path.realpath(path))
        real_root = Path(os.path.realpath(root))
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        raise ImageFileError(path, f"unusable path: {error}") from error
    if not real.is_relative_to(real_root):
        raise ImageFileError(
            path,
            f"resolves to {real}, outside the image folder {real_root} (a symlink leaving "
            "the dataset); the file was not read. Replace the link with the file itself",
        )
    return path


# --- size from the header ------------------------------------------------------------------


def _require_file(path: SourcePath) -> None:
    # Locally only: an object's absence shows when it is opened, without an extra request.
    try:
        require_regular_file(path)
    except FileNotFoundError as error:
        raise ImageFileError(path, "file not found") from error
    except NotARegularFile as error:
        raise ImageFileError(path, error.reason) from error


def _pillow_size(path: SourcePath, image_format: str) -> tuple[int, int]:
    try:
        # Image.open parses the header only; pixels are decoded on load(), which we never call.
        with open_source_file(path) as handle, Image.open(handle, formats=[image_format]) as image:
            width, height = image.size
    except FileNotFoundError as error:
        raise ImageFileError(path, "file not found") from error
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ImageFileError(path, f"cannot read {image_format} header: {error}") from error
    return height, width


def _dicom_size(path: SourcePath) -> tuple[int, int]:
    try:
        with open_source_file(path) as handle:
            header = pydicom.dcmread(handle, stop_before_pixels=True)
        return int(header.Rows), int(header.Columns)
    except FileNotFoundError as error:
        raise ImageFileError(path, "file not found") from error
    except SourceStoreError:
        raise  # the store, not this file: stops the step
    except Exception as error:
        # pydicom's parser raises many unrelated types on corrupt input (struct.error,
        # EOFError, InvalidDicomError, AttributeError for a missing tag, ...).
        raise ImageFileError(path, f"cannot read DICOM Rows/Columns: {error!r}") from error


def image_size(path: SourcePath) -> tuple[int, int]:
    """(height, width) of a JPEG, PNG or DICOM file, from its header, chosen by extension."""
    path = as_source_path(path)
    suffix = path.suffix.lower()
    if suffix not in PILLOW_FORMATS and suffix != DICOM_SUFFIX:
        raise ImageFileError(path, f"unsupported extension {path.suffix!r}")
    _require_file(path)
    if suffix == DICOM_SUFFIX:
        return _dicom_size(path)
    return _pillow_size(path, PILLOW_FORMATS[suffix])


# --- grayscale PNG pixels ------------------------------------------------------------------


def _sixteen_bit(pixels: np.ndarray, path: Path) -> np.ndarray:
    # Older Pillow opens 16-bit PNGs as 32-bit mode I; the values still fit in uint16.
    if pixels.size and (pixels.min() < 0 or pixels.max() > UINT16_MAX):
        raise ImageFileError(path, "mode I pixels outside the 16-bit range")
    return pixels.astype(np.uint16)


def _channel_problems(pixels: np.ndarray) -> list[str]:
    """Why an RGB(A) array is not lossless grayscale; empty if it is."""
    red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    problems = []
    if pixels.shape[-1] == 4:
        opaque_misses = np.count_nonzero(pixels[..., 3] != 255)
        if opaque_misses:
            problems.append(f"RGBA with alpha != 255 in {opaque_misses:,} pixels")
    channel_misses = np.count_nonzero((red != green) | (red != blue))
    if channel_misses:
        problems.append(f"channels differ in {channel_misses:,} pixels")
    return problems


def _grayscale_from_colour(pixels: np.ndarray, mode: str, path: Path) -> np.ndarray:
    problems = _channel_problems(pixels)
    if problems:
        raise ImageFileError(path, f"{mode} PNG is not grayscale: {'; '.join(problems)}")
    return np.ascontiguousarray(pixels[..., 0])


def _decode_png(path: SourcePath, content: bytes | None) -> tuple[np.ndarray, str]:
    try:
        source = readable(path, content)
    except FileNotFoundError as error:
        raise ImageFileError(path, "file not found") from error
    except NotARegularFile as error:
        raise ImageFileError(path, error.reason) from error
    try:
        with Image.open(source, formats=["PNG"]) as image:
            return np.array(image), image.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ImageFileError(path, f"cannot decode PNG: {error}") from error


def read_grayscale_png(path: SourcePath, content: bytes | None = None) -> tuple[np.ndarray, str]:
    """A PNG's pixels as a 2-D array (uint8 or uint16) and the PNG's original mode;
    `content` is the file's bytes when the caller has already read them.

    RGB and RGBA are accepted only when they are lossless grayscale (R == G == B, alpha
    255 everywhere), as in ChestX-Det's RGBA files inherited from ChestX-ray14.
    """
    path = as_source_path(path)
    pixels, mode = _decode_png(path, content)
    if mode == "L":
        return pixels, mode
    if mode.startswith("I;16") or mode == "I":
        return _sixteen_bit(pixels, path), mode
    if mode in ("RGB", "RGBA"):
        return _grayscale_from_colour(pixels, mode, path), mode
    raise ImageFileError(path, f"unsupported PNG mode {mode}")
