"""The synthetic generator writes the four datasets in their real layouts, deterministically."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import struct
from collections import Counter, defaultdict
from pathlib import Path

import cv2
import numpy as np
import pydicom
import pytest
from PIL import Image
from pycocotools import mask as mask_utils
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, RLELossless

from radharmony_pipeline.sources import SOURCE_TYPES, chestx_det, ms_cxr, open_source
from radharmony_pipeline.sources.chexlocalize import SEGMENTED_PATHOLOGIES
from radharmony_pipeline.synthetic import (
    generate_datasets,
    generated_datasets,
    write_full_scale_rexgradient_metadata,
)
from radharmony_pipeline.synthetic.rexgradient import VIEW_POSITIONS

TEST_HEADER = (
    "Path,No Finding,Enlarged Cardiomediastinum,Cardiomegaly,Lung Opacity,Lung Lesion,"
    "Edema,Consolidation,Pneumonia,Atelectasis,Pneumothorax,Pleural Effusion,"
    "Pleural Other,Fracture,Support Devices"
)
VAL_HEADER = TEST_HEADER.replace("Path,", "Path,Sex,Age,Frontal/Lateral,AP/PA,", 1)
UID_ROOT = "1.2.826.0.1.3680043.8.498."
REX_SPLIT_FILES = {"train": "train", "val": "valid", "test": "test"}
FULL_SCALE = {
    "train": (140_000, 238_968, 95_716),
    "val": (10_000, 17_007, 6_964),
    "test": (10_000, 17_029, 6_807),
}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    generate_datasets(root, scale="tiny", seed=0)
    return root


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def expected_counts(root: Path) -> dict:
    return json.loads((root / "expected_counts.json").read_text())


# --- the public API ------------------------------------------------------------------------


def test_returns_each_dataset_root(tmp_path: Path) -> None:
    roots = generate_datasets(tmp_path, datasets=["chexlocalize", "ms_cxr"])
    assert roots == {"chexlocalize": tmp_path / "chexlocalize", "ms_cxr": tmp_path / "ms-cxr"}
    assert not (tmp_path / "chestx-det").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".staging", ".old"))]


@pytest.mark.build
def test_default_writes_every_registered_dataset_with_a_generator(out: Path) -> None:
    assert generated_datasets() == tuple(
        key for key, source in SOURCE_TYPES.items() if source.synthetic_generator
    )
    assert {"chexlocalize", "ms_cxr", "chestx_det", "rexgradient"} <= set(generated_datasets())
    for folder in ("chexlocalize", "ms-cxr", "mimic-cxr", "chestx-det", "rexgradient"):
        assert (out / folder).is_dir()
    for dataset in generated_datasets():
        # Each dataset's reader finds its generated root and its expected counts there.
        source = open_source(dataset, environ={"RADHARMONY_DATA_ROOT": str(out)})
        assert (source.root / "expected_counts.json").is_file(), dataset


@pytest.mark.build
def test_same_seed_gives_byte_identical_trees(out: Path, tmp_path: Path) -> None:
    generate_datasets(tmp_path, scale="tiny", seed=0)
    assert tree_digest(tmp_path) == tree_digest(out)


@pytest.mark.build
def test_another_seed_gives_other_files(out: Path, tmp_path: Path) -> None:
    generate_datasets(tmp_path, scale="tiny", seed=1)
    first, second = tree_digest(out), tree_digest(tmp_path)
    for name in (
        "ms-cxr/MS_CXR_Local_Alignment_v1.1.0.csv",
        "chestx-det/ChestX_Det_train.json",
        "chexlocalize/CheXlocalize/gt_segmentations_test.json",
        "rexgradient/download/metadata/train_metadata_view_position.json",
    ):
        assert first[name] != second[name], name


def test_regenerating_in_place_replaces_the_dataset(tmp_path: Path) -> None:
    generate_datasets(tmp_path, datasets=["chexlocalize"], seed=0)
    before = tree_digest(tmp_path)
    generate_datasets(tmp_path, datasets=["chexlocalize"], seed=1)
    assert tree_digest(tmp_path) != before
    generate_datasets(tmp_path, datasets=["chexlocalize"], seed=0)
    assert tree_digest(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chexlocalize"]


def test_refuses_to_replace_data_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "chexlocalize").mkdir()
    (tmp_path / "chexlocalize" / "real_data.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="did not write"):
        generate_datasets(tmp_path, datasets=["chexlocalize"])
    assert (tmp_path / "chexlocalize" / "real_data.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("arguments", "allowed"),
    [
        ({"scale": "huge"}, "tiny, small"),
        ({"datasets": ["nih"]}, "chexlocalize, ms_cxr, chestx_det, rexgradient"),
        ({"mimic_format": "png"}, "jpg, dcm, mixed"),
    ],
)
def test_unknown_choices_name_the_allowed_values(
    tmp_path: Path, arguments: dict, allowed: str
) -> None:
    with pytest.raises(ValueError, match=allowed):
        generate_datasets(tmp_path, **arguments)
    assert not any(tmp_path.iterdir())


# --- CheXlocalize --------------------------------------------------------------------------


def chexlocalize_rows(out: Path, split: str) -> list[dict[str, str]]:
    return read_csv(out / "chexlocalize" / "CheXpert" / f"{split}_labels.csv")[1]


def image_path_of(row_path: str, split: str) -> str:
    """CSV Path -> path under CheXpert/ (val rows carry the CheXpert-v1.0/valid/ prefix)."""
    return f"{split}/" + row_path.split("/", 2 if row_path.startswith("CheXpert") else 1)[-1]


def test_chexlocalize_csv_headers_and_values(out: Path) -> None:
    base = out / "chexlocalize" / "CheXpert"
    assert (base / "test_labels.csv").read_text().splitlines()[0] == TEST_HEADER
    assert (base / "val_labels.csv").read_text().splitlines()[0] == VAL_HEADER
    labels = TEST_HEADER.split(",")[1:]
    for row in chexlocalize_rows(out, "test"):
        assert re.fullmatch(
            r"test/patient\d{5}/study\d+/view\d+_(frontal|lateral)\.jpg", row["Path"]
        )
        assert {row[label] for label in labels} <= {"0.0", "1.0"}
    for row in chexlocalize_rows(out, "val"):
        assert re.fullmatch(
            r"CheXpert-v1\.0/valid/patient\d{5}/study\d+/"
            r"view\d+_(frontal|lateral)\.jpg",
            row["Path"],
        )
        assert {row[label] for label in labels} <= {"0", "1"}
        assert row["Sex"] in {"Male", "Female"} and row["Age"].isdigit()
        frontal = row["Path"].endswith("frontal.jpg")
        assert row["Frontal/Lateral"] == ("Frontal" if frontal else "Lateral")
        assert (row["AP/PA"] in {"AP", "PA"}) if frontal else row["AP/PA"] == ""


def test_chexlocalize_csv_rows_match_the_jpegs_on_disk(out: Path) -> None:
    base = out / "chexlocalize" / "CheXpert"
    for split in ("val", "test"):
        listed = {image_path_of(row["Path"], split) for row in chexlocalize_rows(out, split)}
        on_disk = {str(p.relative_to(base)) for p in (base / split).rglob("*.jpg")}
        assert listed == on_disk
        studies_per_patient = Counter(
            p.split("/")[1] for p in {s.rsplit("/", 1)[0] for s in listed}
        )
        assert max(studies_per_patient.values()) >= 2
        assert any(p.endswith("lateral.jpg") for p in listed)
        patients = {int(p.split("/")[1].removeprefix("patient")) for p in listed}
        assert min(patients) >= 64541


def test_chexlocalize_jpegs_are_baseline_grayscale_of_varied_sizes(out: Path) -> None:
    sizes = set()
    for path in (out / "chexlocalize" / "CheXpert").rglob("*.jpg"):
        with Image.open(path) as image:
            assert (image.format, image.mode) == ("JPEG", "L")
            assert "jfif" in image.info and not image.info.get("progressive")
            assert image.width != image.height
            assert min(image.size) >= 150 and max(image.size) <= 400
            sizes.add(image.size)
    assert len(sizes) > 5


def decode(rle: dict) -> np.ndarray:
    return mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})


def is_positive(row: dict[str, str], pathology: str) -> bool:
    return row["Lung Opacity" if pathology == "Airspace Opacity" else pathology] in {"1", "1.0"}


def test_chexlocalize_segmentations_agree_with_labels_and_images(out: Path) -> None:
    base = out / "chexlocalize"
    for split in ("val", "test"):
        rows = {image_path_of(r["Path"], split): r for r in chexlocalize_rows(out, split)}
        entries = json.loads((base / "CheXlocalize" / f"gt_segmentations_{split}.json").read_text())
        ids = {}
        for path, row in rows.items():
            _, patient, study, view = path.removesuffix(".jpg").split("/")
            ids[f"{patient}_{study}_{view}"] = (path, row)
        assert set(entries) <= set(ids)
        unsegmented = [
            cxr_id
            for cxr_id, (path, row) in ids.items()
            if path.endswith("frontal.jpg")
            and cxr_id not in entries
            and any(is_positive(row, name) for name in SEGMENTED_PATHOLOGIES)
        ]
        # The release's quirk (like patient65086): one positive frontal without an entry.
        assert len(unsegmented) == (1 if split == "test" else 0)
        for cxr_id, entry in entries.items():
            path, row = ids[cxr_id]
            assert path.endswith("frontal.jpg")
            assert tuple(entry) == SEGMENTED_PATHOLOGIES
            with Image.open(base / "CheXpert" / path) as image:
                pixels = np.asarray(image, dtype=float)
            for name, rle in entry.items():
                mask = decode(rle)
                assert rle["size"] == list(pixels.shape) == list(mask.shape)
                assert mask.any() == is_positive(row, name), (cxr_id, name)
                if mask.any():
                    # The finding is painted where its mask is: brighter than the image.
                    assert pixels[mask > 0].mean() > pixels.mean(), (cxr_id, name)
        assert 0 < len(entries) < len(rows)


def test_chexlocalize_expected_counts_match_disk(out: Path) -> None:
    base = out / "chexlocalize"
    counts = expected_counts(base)
    assert counts["dataset"] == "chexlocalize"
    for split in ("val", "test"):
        paths = [image_path_of(r["Path"], split) for r in chexlocalize_rows(out, split)]
        entries = json.loads((base / "CheXlocalize" / f"gt_segmentations_{split}.json").read_text())
        assert counts["splits"][split] == {
            "images": len(paths),
            "patients": len({p.split("/")[1] for p in paths}),
            "studies": len({tuple(p.split("/")[1:3]) for p in paths}),
            "images_with_segmentation": len(entries),
            "images_with_masks": sum(
                any(mask_utils.area(rle) > 0 for rle in entry.values())
                for entry in entries.values()
            ),
            "uncertain_labels": sum(
                value.strip() in ("-1", "-1.0")
                for row in chexlocalize_rows(out, split)
                for value in row.values()
            ),
            "entries_without_the_10_pathologies": sum(len(e) != 10 for e in entries.values()),
        }


# --- MS-CXR --------------------------------------------------------------------------------


def ms_cxr_rows(out: Path) -> list[dict[str, str]]:
    columns, rows = read_csv(out / "ms-cxr" / "MS_CXR_Local_Alignment_v1.1.0.csv")
    assert columns == list(ms_cxr.CSV_COLUMNS)
    return rows


def mimic_file(out: Path, csv_path: str) -> Path:
    jpg = out / "mimic-cxr" / csv_path
    dcm = jpg.with_suffix(".dcm")
    assert jpg.exists() != dcm.exists(), csv_path
    return jpg if jpg.exists() else dcm


def test_ms_cxr_csv_rows(out: Path) -> None:
    rows = ms_cxr_rows(out)
    for row in rows:
        assert re.fullmatch(r"([0-9a-f]{8}-){4}[0-9a-f]{8}", row["dicom_id"])
        match = re.fullmatch(r"files/p(\d\d)/p(\d{8})/s\d{8}/(.+)\.jpg", row["path"])
        assert match and match[2].startswith(match[1]) and match[3] == row["dicom_id"]
        x, y, w, h, width, height = (
            int(row[k]) for k in ("x", "y", "w", "h", "image_width", "image_height")
        )
        assert x >= 0 and y >= 0 and w > 0 and h > 0
        assert x + w <= width and y + h <= height and width != height
    assert {r["category_name"] for r in rows} == set(ms_cxr.CATEGORIES)
    assert {r["split"] for r in rows} == {"train", "val", "test"}
    boxes_per_phrase = Counter((r["dicom_id"], r["category_name"], r["label_text"]) for r in rows)
    assert {2, 3} <= set(boxes_per_phrase.values()) and max(boxes_per_phrase.values()) <= 3
    categories_per_image = defaultdict(set)
    studies_per_patient = defaultdict(set)
    for r in rows:
        categories_per_image[r["dicom_id"]].add(r["category_name"])
        studies_per_patient[r["path"].split("/")[2]].add(r["path"].split("/")[3])
    assert max(len(c) for c in categories_per_image.values()) >= 2
    assert max(len(s) for s in studies_per_patient.values()) >= 2
    assert any("," in r["label_text"] for r in rows)


def test_ms_cxr_mixed_tree_covers_every_dicom_encoding(out: Path) -> None:
    syntaxes, photometrics, bits, windowed, rescaled, jpgs = set(), set(), set(), set(), set(), 0
    for row in {r["dicom_id"]: r for r in ms_cxr_rows(out)}.values():
        path = mimic_file(out, row["path"])
        size = (int(row["image_height"]), int(row["image_width"]))
        if path.suffix == ".jpg":
            jpgs += 1
            with Image.open(path) as image:
                assert (image.mode, image.size[::-1]) == ("L", size)
            continue
        ds = pydicom.dcmread(path)
        assert ds.SOPClassUID == "1.2.840.10008.5.1.4.1.1.1.1" and ds.Modality == "DX"
        assert (ds.Rows, ds.Columns) == size
        assert ds.BitsAllocated == 16 and ds.HighBit == ds.BitsStored - 1
        assert ds.PixelRepresentation == 0
        pixels = ds.pixel_array
        assert pixels.shape == size and int(pixels.max()) < 2**ds.BitsStored
        shown = pixels.max() - pixels if ds.PhotometricInterpretation == "MONOCHROME1" else pixels
        # After honouring the photometric interpretation the body is brighter than the air.
        corners = np.concatenate([shown[:10, :10].ravel(), shown[:10, -10:].ravel()])
        assert shown[size[0] // 3 : 2 * size[0] // 3].mean() > corners.mean()
        syntaxes.add(ds.file_meta.TransferSyntaxUID)
        photometrics.add(ds.PhotometricInterpretation)
        bits.add(ds.BitsStored)
        windowed.add("WindowCenter" in ds and "WindowWidth" in ds)
        rescaled.add("RescaleSlope" in ds)
    assert syntaxes == {ExplicitVRLittleEndian, RLELossless, JPEG2000Lossless}
    assert photometrics == {"MONOCHROME1", "MONOCHROME2"}
    assert bits == {12, 15} and windowed == {True, False} and rescaled == {True, False}
    assert jpgs > 0


@pytest.mark.parametrize("mimic_format", ["jpg", "dcm"])
def test_ms_cxr_single_format_trees(tmp_path: Path, mimic_format: str) -> None:
    generate_datasets(tmp_path, datasets=["ms_cxr"], mimic_format=mimic_format)
    suffixes = {p.suffix for p in (tmp_path / "mimic-cxr" / "files").rglob("*.*")}
    assert suffixes == {f".{mimic_format}"}
    assert all(r["path"].endswith(".jpg") for r in ms_cxr_rows(tmp_path))


def test_ms_cxr_expected_counts_match_disk(out: Path) -> None:
    rows = ms_cxr_rows(out)
    counts = expected_counts(out / "ms-cxr")
    assert counts["dataset"] == "ms_cxr"
    for split in ("train", "val", "test"):
        chosen = [r for r in rows if r["split"] == split]
        assert counts["splits"][split] == {
            "images": len({r["dicom_id"] for r in chosen}),
            "patients": len({r["path"].split("/")[2] for r in chosen}),
            "studies": len({r["path"].split("/")[3] for r in chosen}),
            "annotations": len(chosen),
        }
    assert counts["total"] == {
        "images": len({r["dicom_id"] for r in rows}),
        "annotations": len(rows),
    }
    assert len(list((out / "mimic-cxr" / "files").rglob("*.*"))) == counts["total"]["images"]


# --- ChestX-Det ----------------------------------------------------------------------------


def chestx_det_entries(out: Path, split: str) -> list[dict]:
    return json.loads((out / "chestx-det" / f"ChestX_Det_{split}.json").read_text())


def test_chestx_det_json_entries(out: Path) -> None:
    names = []
    for split in ("train", "test"):
        for entry in chestx_det_entries(out, split):
            assert set(entry) == {"file_name", "syms", "boxes", "polygons"}
            assert len(entry["syms"]) == len(entry["boxes"]) == len(entry["polygons"])
            assert set(entry["syms"]) <= set(chestx_det.CLASSES)
            assert 36199 <= int(entry["file_name"].removesuffix(".png")) <= 70958
            for box, polygon in zip(entry["boxes"], entry["polygons"], strict=True):
                points = np.array(polygon)
                assert points.dtype.kind == "i" and points.shape[1] == 2
                assert points.min() >= 0 and points.max() <= 1023
                assert box == [*points.min(axis=0).tolist(), *points.max(axis=0).tolist()]
            names.append(entry["file_name"])
    assert len(names) == len(set(names))


def test_chestx_det_has_negatives_repeats_and_overlaps(out: Path) -> None:
    entries = chestx_det_entries(out, "train") + chestx_det_entries(out, "test")
    assert any(not e["syms"] for e in entries)
    assert any(max(Counter(e["syms"]).values(), default=0) >= 2 for e in entries)

    def overlaps(entry: dict) -> bool:
        masks = defaultdict(lambda: np.zeros((1024, 1024), np.uint8))
        for sym, polygon in zip(entry["syms"], entry["polygons"], strict=True):
            cv2.fillPoly(masks[sym], [np.array(polygon, np.int32)], 1)
        classes = list(masks.values())
        return any((a & b).any() for i, a in enumerate(classes) for b in classes[i + 1 :])

    assert any(overlaps(e) for e in entries if {"Consolidation", "Effusion"} <= set(e["syms"]))


def test_chestx_det_pngs(out: Path) -> None:
    modes = Counter()
    for split in ("train", "test"):
        listed = {e["file_name"] for e in chestx_det_entries(out, split)}
        on_disk = {p.name for p in (out / "chestx-det" / split).iterdir()}
        assert listed == on_disk
        for name in listed:
            with Image.open(out / "chestx-det" / split / name) as image:
                assert (image.format, image.size) == ("PNG", (1024, 1024))
                modes[image.mode] += 1
                if image.mode == "RGBA":
                    r, g, b, a = (np.asarray(c) for c in image.split())
                    assert (r == g).all() and (g == b).all() and (a == 255).all()
    assert set(modes) == {"L", "RGBA"} and modes["L"] > modes["RGBA"]


def test_chestx_det_expected_counts_match_disk(out: Path) -> None:
    counts = expected_counts(out / "chestx-det")
    assert counts["dataset"] == "chestx_det"
    total = Counter()
    for split in ("train", "test"):
        entries = chestx_det_entries(out, split)
        split_counts = Counter(
            {
                "images": len(entries),
                "annotations": sum(len(e["syms"]) for e in entries),
                "negatives": sum(not e["syms"] for e in entries),
                "images_with_masks": sum(bool(e["syms"]) for e in entries),
                "rgba_images": sum(
                    Image.open(out / "chestx-det" / split / e["file_name"]).mode == "RGBA"
                    for e in entries
                ),
            }
        )
        for entry in entries:
            unified = [
                {"Effusion": "pleural_effusion"}.get(s, s.lower().replace(" ", "_"))
                for s in entry["syms"]
            ]
            split_counts.update(f"class_annotations.{u}" for u in unified)
            split_counts.update(f"class_images.{u}" for u in set(unified))
        assert counts["splits"][split] == dict(split_counts)
        total.update(split_counts)
    overlap = {k: v for k, v in counts["total"].items() if k.startswith("overlap.")}
    assert {k: v for k, v in counts["total"].items() if k not in overlap} == dict(total)
    multi_class = sum(
        len(set(e["syms"])) > 1
        for split in ("train", "test")
        for e in chestx_det_entries(out, split)
    )
    assert overlap["overlap.multi_class_images"] == multi_class > 0
    assert 0 < overlap["overlap.pixel_overlap_images"] <= multi_class
    for name, together in overlap.items():
        if ".pair_images." in name:
            assert overlap[name.replace(".pair_images.", ".pair_overlap_images.")] <= together


# --- ReXGradient ---------------------------------------------------------------------------


def rex_metadata(root: Path, split: str) -> tuple[str, dict]:
    path = root / "download" / "metadata" / f"{REX_SPLIT_FILES[split]}_metadata_view_position.json"
    text = path.read_text()
    return text, json.loads(text)


def test_rexgradient_json_studies(out: Path) -> None:
    studies = {}
    for split in REX_SPLIT_FILES:
        text, data = rex_metadata(out / "rexgradient", split)
        assert re.search(r": NaN[,}]", text)
        studies.update(data)
    code = r"GRDN[A-Z0-9]{12}"
    dates, shorter, short_views, empty_reports, ethnic = set(), 0, 0, 0, 0
    for key, study in studies.items():
        assert re.fullmatch(code, study["PatientID"])
        assert re.fullmatch(code, study["AccessionNumber"])
        assert study["StudyInstanceUid"].startswith(UID_ROOT)
        assert (
            key == f"p{study['PatientID']}_a{study['AccessionNumber']}_s{study['StudyInstanceUid']}"
        )
        count = len(study["ImagePath"])
        assert 1 <= count <= 3
        for path in study["ImagePath"]:
            parts = path.split("/")
            assert parts[:2] == ["..", "deid_png"] and parts[2:4] == [
                study["PatientID"],
                study["AccessionNumber"],
            ]
            assert parts[4:7] == ["studies", study["StudyInstanceUid"], "series"]
            assert parts[8] == "instances" and parts[9].endswith(".png")
            assert parts[7].startswith(UID_ROOT) and parts[9].startswith(UID_ROOT)
        assert len(study["ImageShape"]) == count
        assert set(study["ImageViewPosition"]) <= set(VIEW_POSITIONS)
        shorter += len(study["ImageBodyPart"]) < count
        short_views += len(study["ImageViewPosition"]) < count
        assert study["PatientSex"] in {"M", "F"}
        assert re.fullmatch(r"\d{3}[YMWD]", study["PatientAge"])
        assert re.fullmatch(r"\d{8}", str(study["StudyDate"]))
        dates.add(type(study["StudyDate"]))
        sections = [study[s] for s in ("Indication", "Comparison", "Findings", "Impression")]
        empty_reports += all(s in ("", "None") or s != s for s in sections)
        ethnic += "EthnicGroup" in study
    assert dates == {int, str} and shorter >= 1 and short_views >= 1 and empty_reports >= 1
    assert 0 < ethnic < len(studies)
    views = {v for s in studies.values() for v in s["ImageViewPosition"]}
    assert None in views and len(views) >= 4


def test_rexgradient_pngs_match_image_shape_in_8_and_16_bits(out: Path) -> None:
    root = out / "rexgradient"
    depths = Counter()
    for split in REX_SPLIT_FILES:
        _, data = rex_metadata(root, split)
        for study in data.values():
            for path, shape in zip(study["ImagePath"], study["ImageShape"], strict=True):
                png = (root / "deid_png" / path.removeprefix("../deid_png/")).read_bytes()
                width, height, depth, colour = struct.unpack(">IIBB", png[16:26])
                assert [height, width] == shape and colour == 0  # single-channel grayscale
                depths[depth] += 1
    assert set(depths) == {8, 16}
    assert depths.total() == len(list((root / "deid_png").rglob("*.png")))


def test_rexgradient_csv_has_one_row_per_study_and_no_paths(out: Path) -> None:
    root = out / "rexgradient"
    for split, stem in REX_SPLIT_FILES.items():
        columns, rows = read_csv(root / "download" / "metadata" / f"{stem}_metadata.csv")
        assert "id" in columns and not any("Path" in c for c in columns)
        assert [r["id"] for r in rows] == list(rex_metadata(root, split)[1])


def rex_counts(data: dict) -> dict[str, int]:
    return {
        "images": sum(len(s["ImagePath"]) for s in data.values()),
        "studies": len(data),
        "patients": len({s["PatientID"] for s in data.values()}),
    }


def test_rexgradient_expected_counts_match_disk(out: Path) -> None:
    counts = expected_counts(out / "rexgradient")
    assert counts["dataset"] == "rexgradient" and set(counts["splits"]) == set(REX_SPLIT_FILES)
    for split in REX_SPLIT_FILES:
        assert counts["splits"][split] == rex_counts(rex_metadata(out / "rexgradient", split)[1])


@pytest.mark.build
def test_full_scale_rexgradient_metadata_has_the_release_counts(tmp_path: Path) -> None:
    root = write_full_scale_rexgradient_metadata(tmp_path, seed=0)
    assert root == tmp_path / "rexgradient"
    assert not (root / "deid_png").exists()
    counts = expected_counts(root)
    for split, (studies, images, patients) in FULL_SCALE.items():
        text, data = rex_metadata(root, split)
        expected = {"images": images, "studies": studies, "patients": patients}
        assert rex_counts(data) == expected == counts["splits"][split]
        assert "NaN" in text
        findings = [s["Findings"] for s in data.values() if isinstance(s["Findings"], str)]
        report_length = np.mean(
            [
                sum(
                    len(s[k])
                    for k in ("Indication", "Comparison", "Findings", "Impression")
                    if isinstance(s[k], str)
                )
                for s in data.values()
            ]
        )
        assert 200 <= report_length <= 1000 and len(findings) > 0.9 * studies
