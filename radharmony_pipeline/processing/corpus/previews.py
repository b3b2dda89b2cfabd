"""Contact sheets of images with their masks and boxes, for a person to check by eye."""

from __future__ import annotations

import functools
import hashlib
import io
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from radharmony_pipeline.processing.imaging.geometry import letterbox_geometry
from radharmony_pipeline.processing.imaging.pixels import stretch_to_uint8
from radharmony_pipeline.processing.storage.store import output_path, publish
from radharmony_pipeline.vocabulary import UNION_CLASS

Colour = tuple[int, int, int]
Box = tuple[float, float, float, float, str]

FONT_SIZE = 14
MASK_ALPHA = 0.4
_LINE = 18  # px per line of text
_PAD = 3
TITLE_LINES = 2
TITLE_BAND = TITLE_LINES * _LINE + 4  # px above each tile: the image id, wrapped
LEGEND_BAND = 2 * _LINE + 2 * _PAD  # px below each tile: two lines of colour swatch + class
_SWATCH = 12
_BACKGROUND: Colour = (24, 24, 24)
_BAND: Colour = (40, 40, 40)
_CHIP: Colour = (0, 0, 0)
_TEXT: Colour = (240, 240, 240)
_DIM_TEXT: Colour = (150, 150, 150)

# Hashing the 22 known names into a palette of about 20 collides often (at 16 colours
# consolidation, edema and lung_opacity share one), and those classes share images, so the
# known classes get fixed, distinct colours; other names fall back to a crc32-indexed slot.
_CLASS_COLOURS: dict[str, Colour] = {
    "atelectasis": (255, 225, 25),
    "cardiomegaly": (230, 25, 75),
    "consolidation": (60, 180, 75),
    "edema": (0, 130, 200),
    "lung_opacity": (245, 130, 48),
    "pleural_effusion": (70, 240, 240),
    "pneumothorax": (240, 50, 230),
    "enlarged_cardiomediastinum": (250, 190, 212),
    "lung_lesion": (170, 80, 220),
    "support_devices": (210, 245, 60),
    "pneumonia": (200, 140, 60),
    "calcification": (220, 190, 255),
    "diffuse_nodule": (0, 160, 160),
    "emphysema": (255, 215, 180),
    "fibrosis": (160, 160, 0),
    "fracture": (255, 250, 200),
    "mass": (190, 70, 20),
    "nodule": (170, 255, 195),
    "pleural_thickening": (90, 110, 255),
    "pleural_other": (255, 160, 120),
    "no_finding": (180, 180, 180),
    UNION_CLASS: (255, 255, 255),
}
_FALLBACK_PALETTE: tuple[Colour, ...] = tuple(_CLASS_COLOURS.values())


@dataclass(frozen=True)
class PreviewSample:
    """One image to show: 2-D grayscale pixels, class masks at its resolution, normalized boxes.

    `boxes` entries are `(y_min, y_max, x_min, x_max, label)` in [0, 1] of the image.
    """

    title: str
    image: np.ndarray
    masks: Mapping[str, np.ndarray] = field(default_factory=dict)
    boxes: Sequence[Box] = ()


@dataclass(frozen=True)
class _Fit:
    """Where the resized image sits inside its square tile (letterboxed, centred)."""

    height: int
    width: int
    top: int
    left: int
    downscale: bool


def class_colour(name: str) -> Colour:
    """The RGB colour of a class, the same in every sheet, run and machine."""
    if name in _CLASS_COLOURS:
        return _CLASS_COLOURS[name]
    # crc32, not hash(): Python salts str hashes per process.
    return _FALLBACK_PALETTE[zlib.crc32(name.encode()) % len(_FALLBACK_PALETTE)]


def cell_height(tile: int) -> int:
    """Height of one sheet cell: title band, the tile, legend band."""
    return TITLE_BAND + tile + LEGEND_BAND


def contact_sheet(
    samples: Sequence[PreviewSample], columns: int = 4, tile: int = 320
) -> Image.Image:
    """A grid of tiles, `min(columns, len(samples))` wide, one per sample, as an RGB image."""
    if not samples:
        raise ValueError("a contact sheet needs at least one sample")
    if columns < 1 or tile < 16:
        raise ValueError(f"columns must be >= 1 and tile >= 16 (got {columns}, {tile})")
    columns = min(columns, len(samples))
    rows = math.ceil(len(samples) / columns)
    sheet = Image.new("RGB", (columns * tile, rows * cell_height(tile)), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    for position, sample in enumerate(samples):
        row, column = divmod(position, columns)
        _draw_cell(sheet, draw, sample, (column * tile, row * cell_height(tile)), tile)
    return sheet


def choose_samples(
    image_ids: Sequence[str], count: int = 16, prefer: Sequence[bool] | None = None
) -> list[int]:
    """Positions of up to `count` images, preferred ones first, each group in sha1-of-id order.

    Ordering by a hash of the id (not by position or a random draw) picks the same images
    on every run and machine, however the rows arrive.
    """
    if prefer is not None and len(prefer) != len(image_ids):
        raise ValueError(f"prefer has {len(prefer)} entries for {len(image_ids)} image ids")
    flags = [True] * len(image_ids) if prefer is None else [bool(flag) for flag in prefer]
    keys = [hashlib.sha1(str(image_id).encode()).hexdigest() for image_id in image_ids]
    order = sorted(range(len(image_ids)), key=lambda i: (not flags[i], keys[i], i))
    return order[: max(count, 0)]


def save_png(image: Image.Image, path: Path | str) -> None:
    """Write `image` as PNG through a temporary file, so no reader sees half a sheet."""
    target = output_path(path) if isinstance(path, str) else path
    publish(target, lambda handle: image.save(handle, format="PNG"))


def mask_at_shape(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """`mask` at `shape`, nearest neighbour so class values stay class values."""
    if mask.shape == shape:
        return mask
    return cv2.resize(mask, (shape[1], shape[0]), interpolation=cv2.INTER_NEAREST)


def small_jpeg(sheet: Image.Image, width: int) -> bytes:
    """A `width`-wide JPEG of the sheet, small enough to inline in run metadata."""
    scale = width / sheet.width
    small = sheet.convert("RGB").resize((width, max(1, round(sheet.height * scale))))
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


def display_gray(image: np.ndarray) -> np.ndarray:
    """8-bit grayscale for display: uint8 as is, anything else min/max-scaled to 0..255."""
    image = np.asarray(image)
    if image.ndim != 2 or image.size == 0:
        raise ValueError(f"a preview image must be a non-empty 2-D array, got shape {image.shape}")
    if image.dtype == np.uint8:
        return image
    values = image.astype(np.float64)
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    return stretch_to_uint8(np.nan_to_num(values, nan=low), low, high)


def _draw_cell(
    sheet: Image.Image,
    draw: ImageDraw.ImageDraw,
    sample: PreviewSample,
    origin: tuple[int, int],
    tile: int,
) -> None:
    x0, y0 = origin
    gray = display_gray(sample.image)  # first: it refuses anything but a 2-D image
    fit = _letterbox(gray.shape, tile)
    masks = {
        name: _tile_mask(sample.masks[name], gray.shape, fit, name) for name in sorted(sample.masks)
    }
    pixels = _render_tile(gray, masks, sample.boxes, fit, tile)
    sheet.paste(Image.fromarray(pixels), (x0, y0 + TITLE_BAND))
    _draw_title(draw, sample.title, origin, tile)
    placed: list[tuple[int, int, int, int]] = []
    for box in sample.boxes:
        _draw_box_label(draw, box, fit, (x0, y0 + TITLE_BAND), tile, placed)
    _draw_legend(draw, _legend_names(masks, sample.boxes), (x0, y0 + TITLE_BAND + tile), tile)


def _letterbox(shape: tuple[int, ...], tile: int) -> _Fit:
    # The images stage's letterbox, so a preview tile is laid out as the stage's output is.
    geometry = letterbox_geometry(shape[0], shape[1], tile)
    return _Fit(
        height=geometry.resized_height,
        width=geometry.resized_width,
        top=geometry.pad_top,
        left=geometry.pad_left,
        downscale=geometry.scale < 1,
    )


def _resize(values: np.ndarray, fit: _Fit) -> np.ndarray:
    # Area averaging keeps thin structures when shrinking; it degrades to nearest when growing.
    interpolation = cv2.INTER_AREA if fit.downscale else cv2.INTER_LINEAR
    return cv2.resize(values, (fit.width, fit.height), interpolation=interpolation)


def _tile_mask(mask: np.ndarray, image_shape: tuple[int, ...], fit: _Fit, name: str) -> np.ndarray:
    """Boolean mask at tile resolution: pixels at least half covered by the class."""
    mask = np.asarray(mask)
    if mask.shape != tuple(image_shape):
        raise ValueError(f"mask {name!r} has shape {mask.shape}, its image {tuple(image_shape)}")
    coverage = _resize((mask > 0).astype(np.float32), fit)
    shown = coverage >= 0.5
    if not shown.any():
        # A finding smaller than half a tile pixel must still be visible on the sheet.
        shown = coverage > 0
    return shown


def _render_tile(
    gray: np.ndarray, masks: Mapping[str, np.ndarray], boxes: Sequence[Box], fit: _Fit, tile: int
) -> np.ndarray:
    """The tile as an RGB array: letterboxed image, blended masks, outlines, box rectangles."""
    resized = _resize(gray, fit)
    area = _blend_masks(np.repeat(resized[..., None], 3, axis=2), masks)
    for name, shown in masks.items():
        contours, _ = cv2.findContours(
            shown.astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE
        )
        cv2.drawContours(area, contours, -1, class_colour(name), 1)
    for box in boxes:
        _outline_box(area, box, fit)
    canvas = np.zeros((tile, tile, 3), dtype=np.uint8)
    canvas[fit.top : fit.top + fit.height, fit.left : fit.left + fit.width] = area
    return canvas


def _blend_masks(rgb: np.ndarray, masks: Mapping[str, np.ndarray]) -> np.ndarray:
    blended = rgb.astype(np.float32)
    for name, shown in masks.items():
        # Each class tints what is already there, so overlapping classes both stay visible.
        colour = np.asarray(class_colour(name), dtype=np.float32)
        blended[shown] = blended[shown] * (1 - MASK_ALPHA) + colour * MASK_ALPHA
    return np.ascontiguousarray(np.rint(blended).astype(np.uint8))


def _box_rectangle(box: Box, fit: _Fit) -> tuple[int, int, int, int] | None:
    """Inclusive (left, top, right, bottom) tile-image pixels the box's edges pass through."""
    y_min, y_max, x_min, x_max = (float(value) for value in box[:4])
    if not all(math.isfinite(value) for value in (y_min, y_max, x_min, x_max)):
        return None
    left, right = _pixel_span(x_min, x_max, fit.width)
    top, bottom = _pixel_span(y_min, y_max, fit.height)
    return left, top, right, bottom


def _pixel_span(low: float, high: float, size: int) -> tuple[int, int]:
    # The box covers edges [low, high) * size; the epsilon keeps exact edges from being
    # nudged a pixel by float error.
    first = math.floor(low * size + 1e-6)
    last = math.ceil(high * size - 1e-6) - 1
    first = min(max(first, 0), size - 1)
    return first, min(max(last, first), size - 1)


def _outline_box(area: np.ndarray, box: Box, fit: _Fit) -> None:
    rectangle = _box_rectangle(box, fit)
    if rectangle is None:
        return
    left, top, right, bottom = rectangle
    colour = class_colour(box[4])
    # Two nested 1-px rectangles: 2 px is visible at a glance and stays inside the box.
    cv2.rectangle(area, (left, top), (right, bottom), colour, 1)
    if right - left >= 2 and bottom - top >= 2:
        cv2.rectangle(area, (left + 1, top + 1), (right - 1, bottom - 1), colour, 1)


def _draw_box_label(
    draw: ImageDraw.ImageDraw,
    box: Box,
    fit: _Fit,
    tile_origin: tuple[int, int],
    tile: int,
    placed: list[tuple[int, int, int, int]],
) -> None:
    """The box's label chip, placed where it covers no chip already drawn on this tile."""
    rectangle = _box_rectangle(box, fit)
    label = str(box[4])
    if rectangle is None or not label:
        return
    left, top, _, bottom = rectangle
    width, height = _chip_size(draw, label)
    x = tile_origin[0] + max(0, min(fit.left + left, tile - width))
    above = tile_origin[1] + fit.top + top - height
    inside = tile_origin[1] + fit.top + top + 2
    below = tile_origin[1] + fit.top + bottom + 2
    lowest = tile_origin[1] + tile - height
    # Above the box, else just inside its top, else below it, else the nearest free row.
    candidates = [y for y in (above, inside, below) if tile_origin[1] <= y <= lowest]
    candidates += [y for y in range(tile_origin[1], lowest + 1, 2) if y not in candidates]

    def free(y: int) -> bool:
        return not any(_overlaps((x, y, x + width, y + height), other) for other in placed)

    # A tile crowded beyond its height keeps the first place (overlap cannot be avoided).
    y = next((y for y in candidates if free(y)), candidates[0] if candidates else inside)
    placed.append((x, y, x + width, y + height))
    _draw_chip(draw, (x, y), label, class_colour(box[4]))


def _overlaps(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _draw_title(draw: ImageDraw.ImageDraw, title: str, origin: tuple[int, int], tile: int) -> None:
    x0, y0 = origin
    draw.rectangle((x0, y0, x0 + tile - 1, y0 + TITLE_BAND - 1), fill=_BAND)
    lines = title_lines(draw, title, tile - 2 * _PAD)
    top = y0 + (TITLE_BAND - len(lines) * _LINE) // 2 + 1
    for number, line in enumerate(lines):
        _draw_text(draw, (x0 + _PAD, top + number * _LINE), line, _TEXT)


def title_lines(draw: ImageDraw.ImageDraw, title: str, max_width: int) -> list[str]:
    """The whole id over up to TITLE_LINES lines, broken after `/`, `_`, `.` or `-` where
    possible; only an id too long for every line loses its head behind an ellipsis."""
    lines: list[str] = []
    rest = title
    while rest and len(lines) < TITLE_LINES - 1 and _text_width(draw, rest) > max_width:
        cut = _longest_fitting_prefix(draw, rest, max_width)
        breaks = [i + 1 for i, ch in enumerate(rest[:cut]) if ch in "/_.-"]
        cut = breaks[-1] if breaks and breaks[-1] > cut // 2 else cut
        lines.append(rest[:cut])
        rest = rest[cut:]
    lines.append(_fit_text(draw, rest, max_width))
    return lines


def _longest_fitting_prefix(draw: ImageDraw.ImageDraw, text: str, max_width: int) -> int:
    low, high = 1, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if _text_width(draw, text[:middle]) <= max_width:
            low = middle
        else:
            high = middle - 1
    return low


def _legend_names(masks: Mapping[str, np.ndarray], boxes: Sequence[Box]) -> list[str]:
    """Mask classes in drawing order, then box labels in order of first appearance."""
    names = list(masks)
    for box in boxes:
        if box[4] not in names:
            names.append(box[4])
    return names


def _draw_legend(
    draw: ImageDraw.ImageDraw, names: Sequence[str], origin: tuple[int, int], tile: int
) -> None:
    x0, y0 = origin
    draw.rectangle((x0, y0, x0 + tile - 1, y0 + LEGEND_BAND - 1), fill=_BAND)
    if not names:
        _draw_text(draw, (x0 + _PAD, y0 + _PAD), "no masks or boxes", _DIM_TEXT)
        return
    line_width = tile - 2 * _PAD
    labels = [_fit_text(draw, name, line_width - _SWATCH - 4) for name in names]
    widths = [_SWATCH + 4 + _text_width(draw, label) + 10 for label in labels]
    lines = (LEGEND_BAND - 2 * _PAD) // _LINE
    places = _legend_places(widths, line_width, lines, _text_width(draw, "+99"))
    for (x, line), name, label in zip(places, names, labels, strict=False):
        _draw_legend_entry(draw, (x0 + _PAD + x, y0 + _PAD + line * _LINE), name, label)
    if len(places) < len(names):
        (x, line), width = places[-1], widths[len(places) - 1]
        more = f"+{len(names) - len(places)}"
        _draw_text(draw, (x0 + _PAD + x + width, y0 + _PAD + line * _LINE), more, _TEXT)


def _legend_places(
    widths: Sequence[int], line_width: int, lines: int, reserve: int
) -> list[tuple[int, int]]:
    """(x, line) of each legend entry that fits; if some do not, leave room for "+N"."""
    places = _flow(widths, [line_width] * lines)
    if len(places) < len(widths):
        places = _flow(widths, [line_width] * (lines - 1) + [line_width - reserve])
    return places


def _flow(widths: Sequence[int], line_widths: Sequence[int]) -> list[tuple[int, int]]:
    """Place entries left to right, wrapping to the next line; stop when the lines run out."""
    places: list[tuple[int, int]] = []
    x, line = 0, 0
    for width in widths:
        if x > 0 and x + width > line_widths[line]:
            x, line = 0, line + 1
            if line == len(line_widths):
                break
        places.append((x, line))
        x += width
    return places


def _draw_legend_entry(
    draw: ImageDraw.ImageDraw, xy: tuple[int, int], name: str, label: str
) -> None:
    x, y = xy
    top = y + (_LINE - _SWATCH) // 2
    draw.rectangle(
        (x, top, x + _SWATCH - 1, top + _SWATCH - 1), fill=class_colour(name), outline=_CHIP
    )
    _draw_text(draw, (x + _SWATCH + 4, y), label, _TEXT)


def _draw_chip(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, colour: Colour) -> None:
    """Text on a dark chip whose top-left corner is `xy`: legible on any part of an X-ray."""
    width, height = _chip_size(draw, text)
    x, y = xy
    draw.rectangle((x, y, x + width - 1, y + height - 1), fill=_CHIP)
    _draw_text(draw, (x + 2, y + 1), text, colour)


def _chip_size(draw: ImageDraw.ImageDraw, text: str) -> tuple[int, int]:
    return _text_width(draw, text) + 4, _LINE


def _draw_text(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, colour: Colour) -> None:
    """Text whose ink starts at `xy` (fonts put blank space above the glyphs; remove it)."""
    left, top, _, _ = draw.textbbox((0, 0), "Ag", font=_font())
    draw.text((xy[0] - left, xy[1] - top + 1), text, font=_font(), fill=colour)


def _text_width(draw: ImageDraw.ImageDraw, text: str) -> int:
    left, _, right, _ = draw.textbbox((0, 0), text, font=_font())
    return int(right - left)


def _fit_text(draw: ImageDraw.ImageDraw, text: str, max_width: int) -> str:
    """The text, or its tail behind an ellipsis: ids differ at the end, not the start."""
    if _text_width(draw, text) <= max_width:
        return text
    tail = text
    while tail and _text_width(draw, "..." + tail) > max_width:
        tail = tail[1:]
    return "..." + tail


@functools.lru_cache(maxsize=1)
def _font() -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=FONT_SIZE)
    except TypeError:
        # Pillow < 10.1 has only the small bitmap font; small text beats no preview.
        return ImageFont.load_default()
