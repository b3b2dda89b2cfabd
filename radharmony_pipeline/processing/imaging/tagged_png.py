"""PNGs that carry text tags (input keys, recorded facts), readable without decoding pixels.

Outputs are keyed by their inputs: a file whose stored key equals the new key is left alone.
Pixels are deflated by ISA-L (radiographs) or OpenCV (masks); the tags go in text chunks
(tEXt, or iTXt beyond Latin-1) right after the header, where Pillow parses them on open.
"""

from __future__ import annotations

import functools
import io
import re
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import cv2
import numpy as np
from isal import isal_zlib
from PIL import Image

from radharmony_pipeline.processing.storage.store import publish_bytes, read_bytes, read_head

INPUT_KEY_TAG = "radharmony-input"

# A radiograph's rows are Average-filtered (each byte minus the mean of its left and upper
# neighbours) and deflated by ISA-L at level 2: within a third of the time of zlib with any
# filter (OpenCV's Paeth + run-length, the previous choice, spent about 1 ms on a 224 x 224
# image, a tenth of a small PNG's whole per-image cost), for files ~11 % larger (compared in
# benchmarks/README.md). Masks are runs of 0 and 255, which filtering only breaks up: no
# filter, and zlib's run-length strategy at level 1 (it searches no further at higher levels).
_AVERAGE_FILTER = 3
_RADIOGRAPH_LEVEL = 2
# ISA-L's deflate returns with the upper halves of the vector registers still in use (its
# AVX code ends without `vzeroupper`), and until something clears them every SSE instruction
# in the process pays for merging them: Pillow's Lanczos resize for the next image's
# perceptual hash ran several times slower, most of a small film's work (benchmarks/README.md).
# NumPy's vector loops end with `vzeroupper`; an add over a few vectors' worth of floats runs
# one (over fewer elements NumPy takes its scalar path, which does not clear them).
_UPPER_STATE_CLEARER = np.zeros(256, np.float32)
MASK_FILTER = cv2.IMWRITE_PNG_FILTER_NONE

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_HEADER_END = len(_SIGNATURE) + 4 + 4 + 13 + 4  # signature, then IHDR: length, type, data, CRC
_MAX_KEYWORD = 79  # PNG's limit on a text chunk's keyword
# An output's tags (its input key, sizes, geometry and three digests) take under 1 KB.
_TAG_HEAD_BYTES = 4096
# PNG keywords: printable Latin-1 (32-126, 161-255), no leading, trailing or double spaces.
_KEYWORD = re.compile(rf"(?!.*  )(?! )[\x21-\x7e\xa1-\xff ]{{1,{_MAX_KEYWORD}}}(?<! )")


def read_png_tags(path: Any) -> dict[str, str]:
    """The text tags of a PNG, or {} if the file is missing, unreadable or damaged (so it is
    rewritten): every chunk's checksum is checked, the pixels are not decoded."""
    try:
        content = read_bytes(path)
    except (OSError, ValueError):
        return {}
    return png_tags(content)


def png_tags(content: bytes) -> dict[str, str]:
    """The text tags of a PNG's bytes, checked as read_png_tags checks a file's ({} if
    damaged), for a caller that needs the bytes for more than the tags."""
    try:
        if png_problem(content) is not None:
            return {}
        with Image.open(io.BytesIO(content), formats=["PNG"]) as image:
            # image.info, not image.text: .text decodes the pixels to look for late chunks.
            return {k: v for k, v in image.info.items() if isinstance(v, str)}
    except (OSError, SyntaxError, ValueError):
        return {}


def png_problem(content: bytes) -> str | None:
    """Why `content` is not a whole PNG (bad signature, a chunk whose CRC does not match, no
    IEND), or None. Chunk CRCs cover every byte but the signature and lengths, so one flipped
    bit anywhere is found without decoding."""
    if not content.startswith(_SIGNATURE):
        return "not a PNG (bad signature)"
    position = len(_SIGNATURE)
    while position + 12 <= len(content):
        (length,) = struct.unpack(">I", content[position : position + 4])
        kind = content[position + 4 : position + 8]
        end = position + 12 + length
        if end > len(content):
            return f"truncated inside its {kind!r} chunk"
        (crc,) = struct.unpack(">I", content[end - 4 : end])
        if zlib.crc32(content[position + 4 : end - 4]) != crc:
            return f"its {kind!r} chunk does not match its checksum"
        if kind == b"IEND":
            return None if end == len(content) else "bytes after its end (IEND)"
        position = end
    return "truncated (no IEND chunk)"


def leading_text_tags(content: bytes) -> dict[str, str]:
    """The tEXt tags of a PNG's bytes that lie right after its header, where with_text_tags
    puts them, parsed without Pillow (microseconds, for checks over many files): the chunks
    are walked from the header until the first that is neither tEXt nor iTXt (iTXt values
    are skipped; read_png_tags reads every tag). Checksums are not checked here."""
    tags: dict[str, str] = {}
    position = _HEADER_END
    while position + 8 <= len(content):
        (length,) = struct.unpack(">I", content[position : position + 4])
        kind = content[position + 4 : position + 8]
        if kind not in (b"tEXt", b"iTXt") or position + 12 + length > len(content):
            break  # the pixels, or a chunk cut off by a read of the file's head
        if kind == b"tEXt":
            keyword, _, value = content[position + 8 : position + 8 + length].partition(b"\0")
            tags[keyword.decode("latin-1")] = value.decode("latin-1")
        position += 12 + length
    return tags


def read_leading_tags(path: Any) -> dict[str, str]:
    """The tags right after a PNG's header, from one read of its first few KB, or {} if the
    file is missing or not a PNG. No checksum is checked: what a re-run reads to see that an
    output carries the current key (damage is found by `radharmony verify`, which then
    withdraws the partition's keys so that every image is checked whole)."""
    try:
        head = read_head(path, _TAG_HEAD_BYTES)
    except (OSError, ValueError):
        return {}
    return leading_text_tags(head) if head.startswith(_SIGNATURE) else {}


def stored_input_key(path: Any) -> str | None:
    """The input key a PNG was written with, if any."""
    return read_png_tags(path).get(INPUT_KEY_TAG)


def grayscale_png(pixels: np.ndarray, row_filter: int) -> bytes:
    """A 2-D uint8 array as an 8-bit grayscale PNG (no tags), OpenCV's `row_filter` on
    every row and zlib's run-length strategy."""
    _require_grey_bytes(pixels)
    # In this order: setting the level resets the strategy to zlib's default.
    options = [
        cv2.IMWRITE_PNG_COMPRESSION, 1,
        cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_RLE,
        cv2.IMWRITE_PNG_FILTER, row_filter,
    ]  # fmt: skip
    encoded, buffer = cv2.imencode(".png", pixels, options)
    if not encoded:
        raise ValueError(f"OpenCV could not encode a {pixels.shape} PNG")
    return buffer.tobytes()


def mask_png(pixels: np.ndarray) -> bytes:
    """A 2-D uint8 mask as an 8-bit grayscale PNG (no tags)."""
    return grayscale_png(pixels, MASK_FILTER)


def radiograph_png(pixels: np.ndarray) -> bytes:
    """A 2-D uint8 radiograph as an 8-bit grayscale PNG (no tags): Average filter, ISA-L."""
    _require_grey_bytes(pixels)
    height, width = pixels.shape
    left = np.zeros(pixels.shape, np.uint16)
    left[:, 1:] = pixels[:, :-1]
    left[1:] += pixels[:-1]  # now left + up, halved below
    rows = np.empty((height, width + 1), np.uint8)
    rows[:, 0] = _AVERAGE_FILTER
    # Differences modulo 256, as the filter defines them.
    np.subtract(pixels, np.right_shift(left, 1), out=rows[:, 1:], casting="unsafe")
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grey, no interlace
    image_data = isal_zlib.compress(rows, _RADIOGRAPH_LEVEL)
    np.add(_UPPER_STATE_CLEARER, _UPPER_STATE_CLEARER, out=_UPPER_STATE_CLEARER)
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", image_data) + _chunk(b"IEND", b"")


def _require_grey_bytes(pixels: np.ndarray) -> None:
    if pixels.ndim != 2 or pixels.dtype != np.uint8 or pixels.size == 0:
        raise ValueError(
            f"expected non-empty 2-D uint8 pixels, got {pixels.dtype} of shape {pixels.shape}"
        )


def with_text_tags(png: bytes, tags: Mapping[str, str]) -> bytes:
    """`png` with one text chunk per tag inserted right after its header (IHDR)."""
    if not png.startswith(_SIGNATURE) or png[12:16] != b"IHDR":
        raise ValueError("not a PNG that starts with its IHDR header")
    whole = memoryview(png)  # joined once: a radiograph's bytes are copied a single time
    chunks = [_text_chunk(name, value) for name, value in tags.items()]
    return b"".join((whole[:_HEADER_END], *chunks, whole[_HEADER_END:]))


def _text_chunk(name: str, value: str) -> bytes:
    """tEXt (Latin-1) when the value allows it, else iTXt (UTF-8), as Pillow writes them."""
    keyword = _keyword(name)
    if "\0" in value:
        raise ValueError(f"PNG tag {name!r}: a text value may not contain NUL")
    try:
        return _chunk(b"tEXt", keyword + b"\0" + value.encode("latin-1"))
    except UnicodeEncodeError:
        # keyword, no compression (flag 0, method 0), empty language and translated keyword
        return _chunk(b"iTXt", keyword + b"\0\0\0\0\0" + value.encode("utf-8"))


@functools.lru_cache(maxsize=256)
def _keyword(name: str) -> bytes:
    """A tag name as a text chunk's keyword; checked once per name (every image has the
    same few)."""
    if not _KEYWORD.fullmatch(name):
        raise ValueError(
            f"PNG tag name {name!r} must be 1-{_MAX_KEYWORD} printable Latin-1 characters "
            "without leading, trailing or double spaces"
        )
    return name.encode("latin-1")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return b"".join(
        (
            struct.pack(">I", len(data)),
            kind,
            data,
            struct.pack(">I", zlib.crc32(data, zlib.crc32(kind))),
        )
    )


def write_tagged_png(
    path: Any,
    pixels: Callable[[], np.ndarray],
    input_key: str,
    tags: Mapping[str, str] | None = None,
    encode: Callable[[np.ndarray], bytes] = radiograph_png,
    absent: bool = False,
) -> bool:
    """Write `pixels()` (2-D uint8, encoded by `encode`) with its input key (and other tags)
    atomically; False if the file already carries the same key and was left untouched
    (mtime included). The pixels are only built when they are written. `absent`: the caller
    knows the file is not there (a listing of its folder said so), so it is not read first:
    on an object store that read is a request, a 404 on every first build."""
    if not absent and stored_input_key(path) == input_key:
        return False
    publish_tagged_png(path, pixels(), input_key, tags, encode)
    return True


def publish_tagged_png(
    path: Any,
    pixels: np.ndarray,
    input_key: str,
    tags: Mapping[str, str] | None = None,
    encode: Callable[[np.ndarray], bytes] = radiograph_png,
) -> None:
    """Write `pixels` (2-D uint8, encoded by `encode`) with its input key (and other tags)
    atomically, whatever the file holds now (for a caller that found it unusable)."""
    publish_bytes(path, tagged_png_bytes(pixels, input_key, tags, encode))


def tagged_png_bytes(
    pixels: np.ndarray,
    input_key: str,
    tags: Mapping[str, str] | None = None,
    encode: Callable[[np.ndarray], bytes] = radiograph_png,
) -> bytes:
    """The bytes publish_tagged_png writes for these arguments."""
    return with_text_tags(encode(pixels), {INPUT_KEY_TAG: input_key, **(tags or {})})
