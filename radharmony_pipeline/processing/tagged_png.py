"""PNGs that carry text tags (input keys, recorded facts), readable without decoding pixels.

Outputs are keyed by their inputs: a file whose stored key equals the new key is left alone.
Tags live in tEXt chunks, which Pillow writes before the image data and parses on open.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

from PIL import Image, PngImagePlugin

from .storage import publish

INPUT_KEY_TAG = "radharmony-input"
# zlib's run-length strategy after PNG's row filters: measured on resized radiographs and on
# masks, it writes files as small as the default (level 6, which also searches for repeated
# strings) or smaller, 4x faster (224x224 radiograph 0.75 ms vs 3.5 ms). Noise and smooth
# gradients leave few repeated strings to find; masks are runs. Readers see the same pixels.
PNG_OPTIONS = {"compress_type": zlib.Z_RLE}


def read_png_tags(path: Any) -> dict[str, str]:
    """The text tags of a PNG, or {} if the file is missing or unreadable (so it is rewritten).

    Only the chunks before the image data are parsed; the pixels are not decoded.
    """
    try:
        with path.open("rb") as handle, Image.open(handle, formats=["PNG"]) as image:
            # image.info, not image.text: .text decodes the pixels to look for late chunks.
            return {k: v for k, v in image.info.items() if isinstance(v, str)}
    except (OSError, SyntaxError, ValueError):
        return {}


def stored_input_key(path: Any) -> str | None:
    """The input key a PNG was written with, if any."""
    return read_png_tags(path).get(INPUT_KEY_TAG)


def write_tagged_png(
    path: Any,
    image: Callable[[], Image.Image],
    input_key: str,
    tags: Mapping[str, str] | None = None,
) -> bool:
    """Write `image()` with its input key (and other tags) atomically; False if the file
    already carries the same key and was left untouched (mtime included). The image is only
    built when it is written."""
    if stored_input_key(path) == input_key:
        return False
    header = PngImagePlugin.PngInfo()
    header.add_text(INPUT_KEY_TAG, input_key)
    for name, value in (tags or {}).items():
        header.add_text(name, value)
    picture = image()
    publish(path, lambda handle: picture.save(handle, format="PNG", pnginfo=header, **PNG_OPTIONS))
    return True
