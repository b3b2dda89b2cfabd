"""ChestX-Det: per-split JSON of polygons and boxes over 1024×1024 NIH ChestX-ray14 PNGs."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import pandas as pd

from ..processing.annotations.masks import polygon_problem
from ..processing.jobs.mask_jobs import MaskTarget, PolygonMaskJob
from ..processing.storage.source_store import SourcePath
from ..vocabulary import snake_case, unified_class
from .base import (
    DatasetSource,
    RowErrors,
    SourceCard,
    SplitTables,
    confine_paths,
    entry_error,
    index_frame,
    label_frame,
    read_json_entries,
)
from .counts import ExpectedCounts
from .errors import MetadataError
from .layouts import Found, chestx_det_image_dir
from .location import SourceLocation
from .views import normalize_view_positions

CLASSES: tuple[str, ...] = (
    "Atelectasis",
    "Calcification",
    "Cardiomegaly",
    "Consolidation",
    "Diffuse Nodule",
    "Effusion",
    "Emphysema",
    "Fibrosis",
    "Fracture",
    "Mass",
    "Nodule",
    "Pleural Thickening",
    "Pneumothorax",
)
FRAME_SIZE = 1024

_CLASS_IMAGES = {
    "consolidation": 1642,
    "pleural_effusion": 1441,
    "fibrosis": 500,
    "pleural_thickening": 499,
    "nodule": 392,
    "fracture": 389,
    "atelectasis": 297,
    "cardiomegaly": 293,
    "calcification": 202,
    "pneumothorax": 189,
    "emphysema": 176,
    "diffuse_nodule": 169,
    "mass": 148,
}
_CLASS_INSTANCES = {
    "consolidation": 2563,
    "pleural_effusion": 2112,
    "fibrosis": 739,
    "pleural_thickening": 631,
    "nodule": 986,
    "fracture": 661,
    "atelectasis": 340,
    "cardiomegaly": 293,
    "calcification": 348,
    "pneumothorax": 211,
    "emphysema": 298,
    "diffuse_nodule": 290,
    "mass": 167,
}


class ChestXDetSource(DatasetSource):
    key = "chestx_det"
    synthetic_generator = "radharmony_pipeline.synthetic.chestx_det"
    native_classes = CLASSES
    card = SourceCard(
        title="ChestX-Det (NIH ChestX-ray14 images)",
        homepage="https://github.com/Deepwise-AILab/ChestX-Det-Dataset",
        licence="Apache-2.0 (annotations) over NIH ChestX-ray14 images (attribution "
        "required: https://nihcc.app.box.com/v/ChestXray-NIHCC)",
        citation="Lian et al., A Structure-Aware Relation Network for Thoracic Diseases "
        "Detection and Segmentation, IEEE TMI 2021 (arXiv:2104.10326); Wang et al., "
        "ChestX-ray8, IEEE CVPR 2017",
    )
    splits = ("train", "test")
    env_vars = {"root": "RADHARMONY_CHESTX_DET_ROOT"}
    layout = """\
chestx-det/
  ChestX_Det_train.json, ChestX_Det_test.json
  train/<file_name>.png
  test/<file_name>.png"""
    documented_counts = ExpectedCounts(
        origin="ChestX-Det dataset card (counts re-derived from the released JSONs)",
        splits={
            "train": {
                "images": 3025,
                "annotations": 7905,
                "negatives": 547,
                "images_with_masks": 3025 - 547,
                "rgba_images": 37,
            },
            "test": {
                "images": 553,
                "annotations": 1734,
                "negatives": 64,
                "images_with_masks": 553 - 64,
                "rgba_images": 5,
            },
        },
        total={
            "images": 3578,
            "annotations": 9639,
            "negatives": 611,
            "images_with_masks": 2967,
            "rgba_images": 42,
            # The card's overlap table, measured there by rasterizing all 9,639 polygons.
            "overlap.multi_class_images": 2006,
            "overlap.pixel_overlap_images": 1357,
            "overlap.mean_pair_iou_permille": 272,
            "overlap.pair_images.consolidation+pleural_effusion": 1028,
            "overlap.pair_overlap_images.consolidation+pleural_effusion": 770,
            "overlap.pair_images.cardiomegaly+consolidation": 158,
            "overlap.pair_overlap_images.cardiomegaly+consolidation": 148,
            "overlap.small_mask_permille": 221,
            "overlap.median_mask_area_permille": 25,
            **{f"class_images.{k}": v for k, v in _CLASS_IMAGES.items()},
            **{f"class_annotations.{k}": v for k, v in _CLASS_INSTANCES.items()},
        },
    )
    mask_classes = tuple(sorted(_CLASS_IMAGES))
    has_boxes = True
    count_hints = {
        "images": "entries of ChestX_Det_{split}.json",
        "annotations": "instances in ChestX_Det_{split}.json (ChestX-Det10 has fewer classes)",
        "negatives": "entries with empty syms in ChestX_Det_{split}.json",
        "class_annotations": "instances of the class in ChestX_Det_<split>.json (a class "
        "renamed or dropped in this release?)",
        "images_with_masks": "images with at least one class mask: entries with polygons",
        "overlap": "the per-class masks filled from the polygons of ChestX_Det_<split>.json: "
        "a different release, polygons filled differently, or masks of one class lost",
        "rgba_images": "PNG modes under train/ and test/: the images were converted (e.g. to "
        "mode L) or replaced; this does not change pixels the pipeline reads",
    }

    # Deepwise renamed the NIH files: the parent image is only found by content, downstream.
    parent_dataset = "nih_chestxray14"

    def __init__(self, location: SourceLocation, data_root: SourcePath):
        self._root = location.root or data_root / "chestx-det"

    @cached_property
    def _image_dirs(self) -> dict[str, Found]:
        # Resolved on first use: opening a reader does no I/O (a store may be unreachable).
        return {split: chestx_det_image_dir(self._root, split) for split in self.splits}

    @cached_property
    def _layout_notes(self) -> list[str]:
        return [found.note for found in self._image_dirs.values() if found.note]

    @property
    def root(self) -> SourcePath:
        return self._root

    def annotation_json(self, split: str) -> SourcePath:
        return self._root / f"ChestX_Det_{split}.json"

    def image_dir(self, split: str) -> SourcePath:
        self.check_split(split)
        return self._image_dirs[split].path

    def annotation_files(self, split: str) -> list[SourcePath]:
        return [self.annotation_json(split)]

    def read_entries(self, split: str) -> list[object]:
        """The split's JSON entries as parsed; see entry_problems for the unusable ones."""
        self.check_split(split)
        path = self.require(self.annotation_json(split), f"ChestX-Det {split} annotation JSON")
        self.require(self.image_dir(split), f"ChestX-Det {split} image folder")
        entries = read_json_entries(
            path,
            list,
            "a JSON list of image entries",
            "ChestX_Det_<split>.json from the ChestX-Det download",
        )
        if entries and not any(isinstance(e, dict) and "polygons" in e for e in entries):
            raise MetadataError(
                path,
                "every entry",
                "has no 'polygons' key: this is ChestX-Det10 (boxes only)",
                "Download ChestX-Det (13 classes, with polygons) from the official Deepwise "
                "repository",
            )
        return entries

    def entry_problems(self, split: str, entries: list[object]) -> dict[int, str]:
        """Why each unusable entry (by position) cannot give an image row."""
        path = self.annotation_json(split)
        problems = {}
        for position, entry in enumerate(entries):
            problem = _entry_problem(entry, position, path)
            if problem is not None:
                problems[position] = problem
        return problems

    def read_split(self, split: str) -> SplitTables:
        entries = self.read_entries(split)
        path = self.annotation_json(split)
        errors = RowErrors(len(entries))
        errors.update(self.entry_problems(split, entries))
        file_names = pd.Series([_file_name(e, i) for i, e in enumerate(entries)], dtype="string")
        image_paths = file_names.where([i not in errors for i in range(len(entries))])
        errors.update(confine_paths(image_paths, path, _entry_label, "file_name"))
        no_view = pd.Series(pd.NA, index=file_names.index, dtype="string")
        index = index_frame(
            self.key,
            split,
            {
                "native_id": file_names.map(_native_id),
                # NIH file names were replaced by opaque integers: no patient or study is known.
                "patient_id": no_view,
                "study_id": no_view,
                "image_path": image_paths,
                "view_position": normalize_view_positions(no_view),
                "view_position_raw": no_view,
                "source_height": [FRAME_SIZE] * len(entries),
                "source_width": [FRAME_SIZE] * len(entries),
            },
        )
        # An unusable entry's findings are unknown: no syms, and null labels below.
        syms = [
            [] if position in errors else list(entry["syms"])
            for position, entry in enumerate(entries)
        ]
        # Every class was annotated on every image, so an absent class is a true 0.
        unknown = [position in errors for position in range(len(entries))]
        native = {
            snake_case(name): pd.array(
                [None if bad else int(name in s) for s, bad in zip(syms, unknown, strict=True)],
                dtype="Int8",
            )
            for name in CLASSES
        }
        unified = {f"label_{unified_class(name)}": native[snake_case(name)] for name in CLASSES}
        labels = label_frame(
            index["image_id"],
            {
                **native,
                "syms": syms,
                "num_instances": pd.array([len(s) for s in syms], dtype="int32"),
                "num_classes_present": pd.array([len(set(s)) for s in syms], dtype="int32"),
                "is_negative": [not s and not bad for s, bad in zip(syms, unknown, strict=True)],
                "report": pd.array([None] * len(entries), dtype="string"),
                # One entry per instance box, parallel to the bboxes table: no phrases here.
                "label_text": [[None] * len(s) for s in syms],
                **unified,
            },
        )
        return SplitTables(index=index, labels=labels).with_row_errors(errors)

    def _usable_entries(self, split: str) -> list[tuple[int, dict]]:
        entries = self.read_entries(split)
        problems = self.entry_problems(split, entries)
        return [(i, e) for i, e in enumerate(entries) if i not in problems]

    def mask_jobs(
        self, split: str, index: pd.DataFrame, target_for: Callable[[str], MaskTarget]
    ) -> list[PolygonMaskJob]:
        """One job per image: its instances' polygons grouped by unified class."""
        path = self.annotation_json(split)
        entries = {_native_id(e["file_name"]): (i, e) for i, e in self._usable_entries(split)}
        base = self.image_dir(split)
        jobs = []
        for image_id, image_key, relative in index[
            ["image_id", "image_key", "image_path"]
        ].itertuples(index=False):
            position, entry = entries[image_id.removeprefix(f"{self.key}/")]
            polygons: dict[str, list] = {}
            problem = None
            for instance, (sym, polygon) in enumerate(
                zip(entry["syms"], entry["polygons"], strict=True)
            ):
                polygons.setdefault(unified_class(sym), []).append(polygon)
                reason = polygon_problem(polygon, FRAME_SIZE, FRAME_SIZE)
                if reason is not None and problem is None:
                    where = _entry_label(position, entry["file_name"])
                    problem = entry_error(path, where, f"polygons[{instance}]", reason)
            jobs.append(
                PolygonMaskJob(
                    image_id,
                    base / relative,
                    target_for(image_key),
                    (FRAME_SIZE, FRAME_SIZE),
                    polygons,
                    image_root=base,
                    problem=problem,
                )
            )
        return jobs

    def read_boxes(self, split: str) -> pd.DataFrame:
        """One row per instance box; `[x1, y1, x2, y2]` corners become top-left + size.

        A box that is not four finite numbers is kept with null coordinates and its reason
        in `error`.
        """
        path = self.annotation_json(split)
        rows = []
        for position, entry in self._usable_entries(split):
            image_id = f"{self.key}/{_native_id(entry['file_name'])}"
            for instance, (sym, box) in enumerate(zip(entry["syms"], entry["boxes"], strict=True)):
                problem = _box_problem(box)
                if problem is None:
                    x, y, w, h = box[0], box[1], box[2] - box[0], box[3] - box[1]
                    error = None
                else:
                    x = y = w = h = float("nan")
                    where = _entry_label(position, entry["file_name"])
                    error = entry_error(path, where, f"boxes[{instance}]", problem)
                rows.append((image_id, instance, unified_class(sym), x, y, w, h, error))
        boxes = pd.DataFrame(
            rows, columns=["image_id", "box_index", "label", "x", "y", "w", "h", "error"]
        )
        boxes.insert(3, "label_text", pd.Series(pd.NA, index=boxes.index, dtype="string"))
        boxes["error"] = boxes["error"].astype("string")
        boxes["frame_height"] = FRAME_SIZE
        boxes["frame_width"] = FRAME_SIZE
        for axis in ("x", "y", "w", "h"):
            boxes[axis] = boxes[axis].astype("float64")
        return boxes

    def count_metrics(self, tables: SplitTables) -> dict[str, int]:
        labels = tables.labels
        images_per_class: Counter[str] = Counter()
        instances_per_class: Counter[str] = Counter()
        for syms in labels["syms"]:
            instances_per_class.update(unified_class(s) for s in syms)
            images_per_class.update({unified_class(s) for s in syms})
        return {
            "images": len(labels),
            "annotations": int(labels["num_instances"].sum()),
            "negatives": int(labels["is_negative"].sum()),
            # Every class, so a class missing from the split is found 0 (not unknown).
            **{f"class_images.{k}": images_per_class[k] for k in self.mask_classes},
            **{f"class_annotations.{k}": instances_per_class[k] for k in self.mask_classes},
        }


def _native_id(file_name: str) -> str:
    return file_name.removesuffix(".png")


def _file_name(entry: object, position: int) -> str:
    """The entry's file name; an entry without one is named by its position."""
    name = entry.get("file_name") if isinstance(entry, dict) else None
    return name if isinstance(name, str) else f"entry-{position}"


def _entry_label(position: int, file_name: object = None) -> str:
    return f"entry {position} ({file_name})" if file_name else f"entry {position}"


def _entry_problem(entry: object, position: int, path: Path) -> str | None:
    """Why an entry cannot give an image row (file, entry, field), or None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
        return entry_error(
            path, _entry_label(position), "file_name", "expected an object with a string file_name"
        )
    where = _entry_label(position, entry["file_name"])
    if "polygons" not in entry:
        return entry_error(path, where, "polygons", "missing (a ChestX-Det10 entry?)")
    lists = [entry.get(key) for key in ("syms", "boxes", "polygons")]
    if not all(isinstance(value, list) for value in lists) or len({len(v) for v in lists}) != 1:
        return entry_error(
            path,
            where,
            "syms/boxes/polygons",
            "must be lists of equal length (one item per instance)",
        )
    for instance, sym in enumerate(entry["syms"]):
        if sym not in CLASSES:
            return entry_error(
                path,
                where,
                f"syms[{instance}]",
                f"unknown class {sym!r}; classes are {', '.join(CLASSES)}",
            )
    return None


def _box_problem(box: object) -> str | None:
    """Why a box is not `[x1, y1, x2, y2]` of finite numbers, or None."""
    if not isinstance(box, list) or len(box) != 4:
        return f"expected [x1, y1, x2, y2], got {box!r}"
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box
    ):
        return f"expected four finite numbers, got {box!r}"
    return None
