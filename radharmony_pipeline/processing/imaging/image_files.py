"""Facts about radiograph files (size, grayscale pixels), decoding as little as possible."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np
import pyspng
from PIL import Image

from radharmony_pipeline.processing.storage.source_store import (
    FileContent,
    FileState,
    NotARegularFile,
    SourcePath,
    SourceStoreError,
    as_source_path,
    file_state,
    is_remote,
    key_problem,
    open_source_file,
    read_source_bytes,
    readable,
    require_regular_file,
    require_regular_mode,
)
from radharmony_pipeline.vocabulary import FORMAT_BY_SUFFIX, suffixes_of

# The Pillow plugin of each source format Pillow reads (DICOM goes to pydicom).
_PILLOW_PLUGINS = {"jpg": "JPEG", "png": "PNG"}
PILLOW_FORMATS = {
    s: _PILLOW_PLUGINS[f] for s, f in FORMAT_BY_SUFFIX.items() if f in _PILLOW_PLUGINS
}
DICOM_SUFFIXES = suffixes_of("dcm")
UINT16_MAX = np.iinfo(np.uint16).max
# The PNG kinds pyspng decodes here, by IHDR (colour type, bit depth), with the mode Pillow
# gives them; pyspng decodes radiograph PNGs ~10 % (grey) to 2x (RGBA) faster than Pillow.
# Anything else (palette, grey + alpha, 1-4 bits), and any file pyspng refuses, goes to
# Pillow, whose messages name the problem.
# 16-bit RGB(A) too: Pillow would hand those over cut to 8 bits, which would then pass as
# lossless grayscale.
PYSPNG_MODES = {(0, 8): "L", (0, 16): "I;16", (2, 8): "RGB", (6, 8): "RGBA",
                (2, 16): "RGB", (6, 16): "RGBA"}  # fmt: skip
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
        real = _real_path(os.fspath(path))
        real_root = _real_folder(os.fspath(root))
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        raise ImageFileError(path, f"unusable path: {error}") from error
    if real != real_root and not real.startswith(os.path.join(real_root, "")):
        raise ImageFileError(
            path,
            f"resolves to {real}, outside the image folder {real_root} (a symlink leaving "
            "the dataset); the file was not read. Replace the link with the file itself",
        )
    return path


def _real_path(path: str) -> str:
    """os.path.realpath(path), with the folder's real path shared by every file in it and
    each ancestor's by every folder below it: a partition's images (ReXGradient's sit eight
    folders deep) cost an lstat of the file and of the folders not yet seen, not of every
    component each time. A process keeps what it resolved (a run's worker, a launch)."""
    folder, name = os.path.split(path)
    if name in ("", ".", "..") or os.path.islink(path):
        return os.path.realpath(path)
    return os.path.join(_real_folder(folder), name)


@functools.lru_cache(maxsize=16384)
def _real_folder(folder: str) -> str:
    return _real_path(folder)


class ConfinedSource(Protocol):
    """A source file known to stay inside its root, with its state (size and mtime, or size
    and ETag); read() returns its bytes, refusing a FIFO, socket, device or folder."""

    path: SourcePath
    state: FileState

    def read(self) -> bytes: ...


class NamedSource:
    """A source reached by its path: read() confines the path again right before opening
    it (an object on a store, or a local path the kernel would not resolve beneath `root`)."""

    def __init__(self, path: SourcePath, root: SourcePath | None, state: FileState) -> None:
        self.path, self.root, self.state = path, root, state

    def read(self) -> bytes:
        return read_source_bytes(confined(self.path, self.root))


class HeldSource:
    """A local source the kernel resolved beneath its root (openat2 with RESOLVE_BENEATH and
    O_PATH: nothing opened for reading yet), held from its state to its read. read() opens
    that same file again through /proc, so the bytes are of the file whose state keyed them,
    whatever a symlink swapped into its path since would lead to, and the path is neither
    resolved nor checked a second time."""

    def __init__(self, path: SourcePath, root: SourcePath, descriptor: int) -> None:
        self.path, self.root, self.descriptor = path, root, descriptor
        found = os.fstat(descriptor)
        self.mode, self.state = found.st_mode, (found.st_size, found.st_mtime_ns)

    def read(self) -> bytes:
        require_regular_mode(self.path, self.mode)  # a FIFO or device is never opened
        try:
            descriptor = os.open(f"/proc/self/fd/{self.descriptor}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            # No /proc here, or the file refuses to be read: by its path, whose error
            # names the problem.
            return NamedSource(self.path, self.root, self.state).read()
        with os.fdopen(descriptor, "rb") as handle:
            return handle.read()


@contextlib.contextmanager
def confined_source(
    path: SourcePath, root: SourcePath | None, state: FileState | None = None
) -> Iterator[ConfinedSource]:
    """The source at `path`, known to stay inside `root`, with its state (`state` when the
    caller has it from one listing of an object store's folder; nothing is asked then).

    Locally on Linux the kernel resolves the path without leaving `root` (openat2 with
    RESOLVE_BENEATH) and the file stays held until the block ends: its state is that one
    lookup's, and reading it resolves nothing again. ReXGradient's images sit eight folders
    deep in folders of their own, and an lstat of each folder costs a walk of its whole path
    (about 6 µs each here), which made confinement most of an unchanged re-run's time per
    image. A path the kernel will not resolve that way (a missing file, an absolute symlink,
    one leaving `root`) is confined as before, which names the problem.
    """
    if state is None and root is not None and not is_remote(path) and not is_remote(root):
        descriptor = _open_beneath(os.fspath(root), os.fspath(path))
        if descriptor is not None:
            try:
                yield HeldSource(path, root, descriptor)
            finally:
                os.close(descriptor)
            return
    if state is None:
        state = file_state(confined(path, root))
    else:
        confined(path, root)  # not even a listing's state for a key outside the folder
    yield NamedSource(path, root, state)


# openat2(2)'s number in the system call tables of x86-64 and 64-bit Arm, its resolve
# flags (linux/openat2.h), and the struct open_how it takes.
_SYS_OPENAT2 = 437
_OPENAT2_MACHINES = ("x86_64", "aarch64")
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
# Refusals meaning openat2 is missing (an older kernel) or forbidden (a container's filter).
_UNSUPPORTED = (errno.ENOSYS, errno.EPERM)


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


# How every source is opened: a path only (nothing opened for I/O), never leaving the folder.
# (O_PATH is Linux's; where it is missing, openat2 is never called.)
_HOW = _OpenHow(
    getattr(os, "O_PATH", 0) | os.O_CLOEXEC, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS
)
_HOW_REFERENCE = ctypes.byref(_HOW)


@functools.cache
def _system_call() -> Callable[..., int] | None:
    """libc's syscall(), where openat2 can be called through it; else None."""
    if sys.platform != "linux" or platform.machine() not in _OPENAT2_MACHINES:
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    call.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
    return call


_openat2_missing = False


def _open_beneath(root: str, path: str) -> int | None:
    """An O_PATH descriptor of `path` resolved by the kernel beneath `root`; None when that
    cannot be done here or the kernel refuses (the caller then confines the path itself)."""
    global _openat2_missing
    call = None if _openat2_missing else _system_call()
    prefix = os.path.join(root, "")
    if call is None or not path.startswith(prefix):
        return None
    try:
        folder = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None
    try:
        relative = os.fsencode(path[len(prefix) :])
        if b"\0" in relative:
            return None
        found = call(_SYS_OPENAT2, folder, relative, _HOW_REFERENCE, ctypes.sizeof(_HOW))
    finally:
        os.close(folder)
    if found < 0:
        if ctypes.get_errno() in _UNSUPPORTED:
            _openat2_missing = True
        return None
    return found


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
    import pydicom  # here: ~0.3 s to import, paid only where DICOMs are measured

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


def header_image_size(path: SourcePath) -> tuple[int, int]:
    """(height, width) of a JPEG, PNG or DICOM file, from its header, chosen by extension."""
    path = as_source_path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMAT_BY_SUFFIX:
        raise ImageFileError(path, f"unsupported extension {path.suffix!r}")
    _require_file(path)
    if suffix in DICOM_SUFFIXES:
        return _dicom_size(path)
    return _pillow_size(path, PILLOW_FORMATS[suffix])


# --- grayscale PNG pixels ------------------------------------------------------------------


def _sixteen_bit(pixels: np.ndarray, path: Path) -> np.ndarray:
    if pixels.dtype == np.uint16:  # pyspng's, and newer Pillow's: nothing to check or copy
        return pixels
    # Older Pillow opens 16-bit PNGs as 32-bit mode I; the values still fit in uint16.
    if pixels.size and (pixels.min() < 0 or pixels.max() > UINT16_MAX):
        raise ImageFileError(path, "mode I pixels outside the 16-bit range")
    return pixels.astype(np.uint16)


def _channel_problems(pixels: np.ndarray) -> list[str]:
    """Why an RGB(A) array is not lossless grayscale; empty if it is."""
    red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    problems = []
    if pixels.shape[-1] == 4:
        opaque = np.iinfo(pixels.dtype).max
        opaque_misses = np.count_nonzero(pixels[..., 3] != opaque)
        if opaque_misses:
            problems.append(f"RGBA with alpha != {opaque} in {opaque_misses:,} pixels")
    channel_misses = np.count_nonzero((red != green) | (red != blue))
    if channel_misses:
        problems.append(f"channels differ in {channel_misses:,} pixels")
    return problems


def _grayscale_from_colour(pixels: np.ndarray, mode: str, path: Path) -> np.ndarray:
    """The red plane of an 8- or 16-bit RGB(A) array that is lossless grayscale: split into
    planes and compared plane against plane by OpenCV (a few passes over memory; numpy's
    comparisons of the interleaved array took about twice as long)."""
    if pixels.ndim != 3 or pixels.shape[-1] not in (3, 4) or pixels.dtype.kind != "u":
        raise ImageFileError(path, f"{mode} PNG decoded to an unexpected {pixels.dtype} array "
                             f"of shape {pixels.shape}")  # fmt: skip
    planes = cv2.split(pixels)
    red = planes[0]
    grey = all(cv2.norm(red, other, cv2.NORM_INF) == 0 for other in planes[1:3])
    opaque = len(planes) < 4 or cv2.minMaxLoc(planes[3])[0] == np.iinfo(pixels.dtype).max
    if grey and opaque:
        return red
    problems = _channel_problems(pixels)
    raise ImageFileError(path, f"{mode} PNG is not grayscale: {'; '.join(problems)}")


def _pyspng_decode(content: bytes) -> tuple[np.ndarray, str] | None:
    """The pixels and Pillow's mode name of a PNG kind in PYSPNG_MODES, else None."""
    if content[:8] != _PNG_SIGNATURE or content[12:16] != b"IHDR" or len(content) < 26:
        return None
    mode = PYSPNG_MODES.get((content[25], content[24]))
    width, height = int.from_bytes(content[16:20], "big"), int.from_bytes(content[20:24], "big")
    limit = Image.MAX_IMAGE_PIXELS
    if mode is None or (limit is not None and width * height > limit):
        return None  # Pillow refuses a decompression bomb before allocating it
    try:
        pixels = pyspng.load(content)
    except (RuntimeError, ValueError):
        return None
    if mode == "I;16" and pixels.ndim == 3:
        # pyspng gives 16-bit grey as grey + alpha (alpha all opaque): keep the grey.
        pixels = np.ascontiguousarray(pixels[..., 0])
    return pixels, mode


def _png_bytes(path: SourcePath) -> bytes:
    source = readable(path)
    return source.read_bytes() if isinstance(source, Path) else source.getvalue()


def _decode_png(path: SourcePath, content: bytes | None) -> tuple[np.ndarray, str]:
    try:
        data = content if content is not None else _png_bytes(path)
    except FileNotFoundError as error:
        raise ImageFileError(path, "file not found") from error
    except NotARegularFile as error:
        raise ImageFileError(path, error.reason) from error
    except OSError as error:  # e.g. access denied
        raise ImageFileError(path, f"cannot read: {error}") from error
    decoded = _pyspng_decode(data)
    if decoded is not None:
        return decoded
    try:
        with Image.open(FileContent(data, path), formats=["PNG"]) as image:
            return np.array(image), image.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ImageFileError(path, f"cannot decode PNG: {error}") from error


def read_grayscale_png(path: SourcePath, content: bytes | None = None) -> tuple[np.ndarray, str]:
    """A PNG's pixels as a 2-D array (uint8 or uint16) and the PNG's original mode;
    `content` is the file's bytes when the caller has already read them.

    RGB and RGBA are accepted only when they are lossless grayscale (R == G == B, alpha
    opaque everywhere: 255, or 65535 at 16 bits), as in ChestX-Det's RGBA files inherited
    from ChestX-ray14.
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
