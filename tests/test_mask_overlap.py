"""Overlap figures on hand-made masks, and box labels that never cover one another."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from radharmony_pipeline.processing.annotations.mask_overlap import image_overlap, overlap_figures
from radharmony_pipeline.processing.corpus.previews import _draw_box_label, _letterbox, _overlaps


def _square(top: int, left: int, side: int, frame: int = 100) -> np.ndarray:
    mask = np.zeros((frame, frame), dtype=np.uint8)
    mask[top : top + side, left : left + side] = 1
    return mask


def test_pairwise_figures_on_known_squares():
    # a and b share a 10×20 strip: intersection 200, union 2*400 - 200 = 600, IoU 1/3.
    overlapping = image_overlap({"a": _square(0, 0, 20), "b": _square(10, 0, 20)})
    apart = image_overlap({"a": _square(0, 0, 10), "c": _square(50, 50, 10)})
    single = image_overlap({"a": _square(0, 0, 5), "empty": np.zeros((100, 100), np.uint8)})
    assert single.classes == ("a",) and single.pairs == ()
    figures = overlap_figures([overlapping, apart, single], [0.04, 0.04, 0.01, 0.01, 0.0025])
    assert figures["overlap.multi_class_images"] == 2
    assert figures["overlap.pixel_overlap_images"] == 1
    assert figures["overlap.mean_pair_iou_permille"] == 333
    assert figures["overlap.pair_images.a+b"] == 1
    assert figures["overlap.pair_overlap_images.a+b"] == 1
    assert figures["overlap.pair_images.a+c"] == 1
    assert figures["overlap.pair_overlap_images.a+c"] == 0
    assert figures["overlap.small_mask_permille"] == 200  # 1 of 5 under 0.5 %
    assert figures["overlap.median_mask_area_permille"] == 10


def test_labels_of_boxes_at_one_place_do_not_cover_one_another():
    sheet = Image.new("RGB", (320, 320))
    draw = ImageDraw.Draw(sheet)
    fit = _letterbox((100, 100), 320)
    placed: list[tuple[int, int, int, int]] = []
    for label in ("consolidation", "pleural_effusion", "atelectasis", "edema"):
        _draw_box_label(draw, (0.3, 0.6, 0.2, 0.5, label), fit, (0, 0), 320, placed)
    assert len(placed) == 4
    for i, first in enumerate(placed):
        assert first[1] >= 0 and first[3] <= 320
        for second in placed[i + 1 :]:
            assert not _overlaps(first, second), (first, second)
