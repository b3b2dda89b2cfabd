"""Contact sheets: layout, where masks and boxes land, colours, sample choice, saving."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from radharmony_pipeline.processing.corpus.previews import (
    LEGEND_BAND,
    TITLE_BAND,
    PreviewSample,
    choose_samples,
    class_colour,
    contact_sheet,
    save_png,
)

TILE = 320
GRAY = 100
# A 200×400 image letterboxes into 320×160 at the tile's vertical centre: scale 0.8.
IMAGE_H, IMAGE_W = 200, 400
SCALE, PAD_TOP, PAD_LEFT = 0.8, 80, 0


def plain_sample(title: str = "synthetic/0", **annotations) -> PreviewSample:
    image = np.full((IMAGE_H, IMAGE_W), GRAY, dtype=np.uint8)
    return PreviewSample(title=title, image=image, **annotations)


def first_tile(sample: PreviewSample) -> np.ndarray:
    """The image area (TILE × TILE) of the first cell of a one-sample sheet, as RGB."""
    sheet = np.asarray(contact_sheet([sample], tile=TILE))
    return sheet[TITLE_BAND : TITLE_BAND + TILE, :TILE].astype(int)


def tile_rows(source_rows: slice) -> slice:
    return slice(PAD_TOP + int(source_rows.start * SCALE), PAD_TOP + int(source_rows.stop * SCALE))


def tile_cols(source_cols: slice) -> slice:
    return slice(
        PAD_LEFT + int(source_cols.start * SCALE), PAD_LEFT + int(source_cols.stop * SCALE)
    )


@pytest.mark.parametrize(("count", "rows"), [(16, 4), (5, 2)])
def test_sheet_size(count, rows):
    sheet = contact_sheet([plain_sample(f"synthetic/{i}") for i in range(count)], tile=TILE)
    assert sheet.size == (1280, rows * (TITLE_BAND + TILE + LEGEND_BAND))
    assert sheet.mode == "RGB"


def test_a_mask_tints_its_region_and_nothing_far_from_it():
    rows, cols = slice(50, 100), slice(100, 200)
    mask = np.zeros((IMAGE_H, IMAGE_W), dtype=np.uint8)
    mask[rows, cols] = 255
    plain = first_tile(plain_sample())
    masked = first_tile(plain_sample(masks={"pleural_effusion": mask}))
    changed = np.abs(masked - plain).sum(axis=2) > 30
    inside = changed[tile_rows(rows), tile_cols(cols)]
    assert inside.mean() > 0.95
    changed[
        tile_rows(rows).start - 2 : tile_rows(rows).stop + 2,
        tile_cols(cols).start - 2 : tile_cols(cols).stop + 2,
    ] = False
    assert not changed.any()


def test_overlapping_masks_of_two_classes_both_show():
    left, right = np.zeros((IMAGE_H, IMAGE_W), np.uint8), np.zeros((IMAGE_H, IMAGE_W), np.uint8)
    left[50:150, 50:250] = 1
    right[50:150, 150:350] = 1
    tile = first_tile(plain_sample(masks={"edema": left, "consolidation": right}))
    only_left, both, only_right = (
        tile[PAD_TOP + 80, PAD_LEFT + int(c * SCALE)] for c in (100, 200, 300)
    )
    assert tuple(only_left) != tuple(only_right)
    assert tuple(both) not in {tuple(only_left), tuple(only_right)}
    # The overlap leans towards each class colour compared with the plain gray.
    for name in ("edema", "consolidation"):
        toward = np.asarray(class_colour(name)) - GRAY
        assert np.dot(both - GRAY, toward) > 0


def test_a_box_outline_lands_where_the_letterboxed_box_should():
    box = (0.25, 0.75, 0.25, 0.5, "nodule")
    tile = first_tile(plain_sample(boxes=[box]))
    top, bottom = PAD_TOP + int(0.25 * 160), PAD_TOP + int(0.75 * 160) - 1
    left, right = PAD_LEFT + int(0.25 * 320), PAD_LEFT + int(0.5 * 320) - 1
    colour = list(class_colour("nodule"))
    middle_row, middle_col = (top + bottom) // 2, (left + right) // 2
    assert tile[middle_row, left].tolist() == colour
    assert tile[middle_row, right].tolist() == colour
    assert tile[bottom, middle_col].tolist() == colour
    assert tile[top, middle_col].tolist() == colour
    # A 2-px outline inside the box: its edge pixels and the next ones in, nothing beyond.
    assert tile[middle_row, left + 1].tolist() == colour
    assert tile[bottom - 1, middle_col].tolist() == colour
    for row, col in [
        (middle_row, left - 1),
        (middle_row, right + 1),
        (bottom + 1, middle_col),
        (top - 1, right - 2),
        (middle_row, left + 2),
        (middle_row, middle_col),
    ]:
        assert tile[row, col].tolist() == [GRAY] * 3, (row, col)


def test_sixteen_bit_images_are_stretched_for_display():
    image = np.tile(np.linspace(1000, 3000, IMAGE_W).astype(np.uint16), (IMAGE_H, 1))
    tile = first_tile(PreviewSample(title="synthetic/16", image=image))
    picture = tile[PAD_TOP : PAD_TOP + 160]
    assert picture.min() <= 5 and picture.max() >= 250


@pytest.mark.slow
def test_classes_get_distinct_colours_that_do_not_change_between_processes():
    assert class_colour("edema") != class_colour("consolidation")
    assert class_colour("pleural_effusion") != class_colour("atelectasis")
    names = ["edema", "a_class_not_in_the_vocabulary"]
    script = (
        "from radharmony_pipeline.processing.corpus.previews import class_colour; "
        f"print([class_colour(n) for n in {names!r}])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {f"{[class_colour(n) for n in names]}\n"}


def test_choose_samples_is_deterministic_and_independent_of_row_order():
    ids = [f"chestx_det/{i}" for i in range(40)]
    chosen = choose_samples(ids, count=10)
    assert chosen == choose_samples(ids, count=10)
    reversed_ids = ids[::-1]
    assert [reversed_ids[i] for i in choose_samples(reversed_ids, count=10)] == [
        ids[i] for i in chosen
    ]
    assert chosen != list(range(10))


def test_choose_samples_prefers_flagged_rows_then_fills():
    ids = [f"ms_cxr/{i}" for i in range(50)]
    flagged = {3, 17, 41}
    chosen = choose_samples(ids, count=8, prefer=[i in flagged for i in range(50)])
    assert set(chosen[:3]) == flagged
    assert len(chosen) == len(set(chosen)) == 8


def test_choose_samples_returns_at_most_the_rows_there_are():
    chosen = choose_samples(["a", "b", "c", "d", "e"], count=16)
    assert sorted(chosen) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="prefer"):
        choose_samples(["a", "b"], prefer=[True])


def test_a_saved_sheet_opens_as_the_same_image(tmp_path):
    mask = np.zeros((IMAGE_H, IMAGE_W), dtype=np.uint8)
    mask[20:60, 30:90] = 1
    sheet = contact_sheet(
        [plain_sample(masks={"edema": mask}, boxes=[(0.1, 0.4, 0.5, 0.9, "mass")])] * 3, tile=TILE
    )
    path = tmp_path / "previews" / "sheet.png"
    save_png(sheet, path)
    with Image.open(path) as reopened:
        assert reopened.format == "PNG"
        assert reopened.size == sheet.size
        assert np.array_equal(np.asarray(reopened.convert("RGB")), np.asarray(sheet))
    assert [p.name for p in path.parent.iterdir()] == ["sheet.png"]


def test_a_mask_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="edema"):
        contact_sheet([plain_sample(masks={"edema": np.zeros((10, 10), np.uint8)})])
