"""Miniature parents with known provenance: an NIH ChestX-ray14 in which ChestX-Det's images
appear under NIH names (byte-identical, re-encoded or absent; patients shared across
ChestX-Det's train and test; some on the other side of NIH's official split), and MIMIC-CXR's
split file with MS-CXR images on the wrong side. Everything planted is in the truth file."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.settings import DATA_ROOT_VARIABLE
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.sources.mimic_splits import SPLIT_COLUMNS, SPLIT_NAMES
from radharmony_pipeline.sources.nih_chestxray14 import FOLDER, SPLIT_LISTS
from radharmony_pipeline.synthetic.duplicates import TRUTH_NAME as DUPLICATES_TRUTH
from radharmony_pipeline.synthetic.encoding import png_bytes
from radharmony_pipeline.synthetic.files import staged_roots, write_bytes, write_text
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng

TRUTH_NAME = "parents_truth.json"
ROOTS = (FOLDER,)
NIH_SIDE = 1024
# Lossy enough that the resized pixels differ, close enough to stay one film.
REENCODE_JPEG_QUALITY = 75
EVALUATION = ("val", "test")
_DATA_ENTRY_HEADER = (
    "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,"
    "View Position,OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]\n"
)


@dataclass(frozen=True)
class Plan:
    """How many of each plant one scale gets."""

    absent: int
    reencoded: int  # half as the same pixels in another PNG, half lossy
    shared_patients: int  # ChestX-Det train/test pairs of one NIH patient
    test_in_nih_train: int  # ChestX-Det test patients NIH lists in train_val
    train_in_nih_test: int
    distractors: int  # other NIH films, of new patients and of ChestX-Det patients
    mimic_test_in_train: int
    mimic_train_in_test: int


PLANS = {
    "tiny": Plan(1, 2, 1, 1, 1, 4, 1, 1),
    "small": Plan(2, 4, 3, 2, 2, 12, 2, 1),
    # NIH's documented 112,120 films: about 3,500 ChestX-Det originals plus the distractors.
    "full": Plan(30, 60, 40, 20, 20, 108_572, 10, 5),
}


def write_parents(out: Path, scale: str, seed: int) -> Path:
    """Write the NIH miniature beside ChestX-Det and the split file into the MIMIC root;
    return `out/parents_truth.json`."""
    out = Path(out)
    plan = PLANS[scale]
    environ = {DATA_ROOT_VARIABLE: str(out)}
    with staged_roots(out, "nih_chestxray14", ROOTS) as stage:
        nih = _write_nih(stage / FOLDER, out, environ, plan, seed)
    mimic = _write_mimic_splits(environ, plan)
    truth = {"nih": nih, "mimic": mimic, "expected": _expected(nih, mimic)}
    path = out / TRUTH_NAME
    write_text(path, json.dumps(truth, indent=2, sort_keys=True) + "\n")
    return path


def read_parents_truth(out: Path) -> dict:
    return json.loads((Path(out) / TRUTH_NAME).read_text())


# --- NIH ChestX-ray14 ------------------------------------------------------------------------


def _chestx_det_images(environ: Mapping[str, str]) -> list[tuple[str, str, Path]]:
    """(image_id, split, file) of every ChestX-Det image, in image_id order."""
    source = open_source("chestx_det", SourceLocation(), environ)
    images = []
    for split in source.splits:
        index = source.read_split(split).index
        folder = source.image_dir(split)
        images += [
            (str(i), split, folder / str(p))
            for i, p in zip(index["image_id"], index["image_path"], strict=True)
        ]
    return sorted(images)


def _planted_duplicates(out: Path) -> set[str]:
    """ChestX-Det images touched by planted duplicates: kept byte-identical in NIH, since a
    re-encoded or absent one would be as close to its twin's NIH copy as to its own."""
    path = out / DUPLICATES_TRUTH
    if not path.is_file():
        return set()
    return {
        image_id
        for plant in json.loads(path.read_text())
        for image_id in (plant["source_id"], plant["target_id"])
    }


def _write_nih(root: Path, out: Path, environ: Mapping[str, str], plan: Plan, seed: int) -> dict:
    rng = dataset_rng(seed, "nih_chestxray14", 0)
    children = _chestx_det_images(environ)
    by_bytes: dict[str, list[int]] = {}
    for position, (_, _, path) in enumerate(children):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        by_bytes.setdefault(digest, []).append(position)
    # One NIH film per distinct file: byte-identical ChestX-Det images share their original.
    originals = [positions for positions in by_bytes.values()]
    originals.sort(key=lambda positions: children[positions[0]][0])
    planted = _planted_duplicates(out)
    free = [
        i
        for i, positions in enumerate(originals)
        if len(positions) == 1 and children[positions[0]][0] not in planted
    ]
    chosen = rng.permutation(free).tolist()
    absent = set(chosen[: plan.absent])
    reencoded = chosen[plan.absent : plan.absent + plan.reencoded]
    kinds = {i: "identical_file" for i in range(len(originals))}
    for number, i in enumerate(reencoded):
        kinds[i] = "identical_pixels" if number % 2 == 0 else "near"
    for i in absent:
        kinds[i] = "absent"
    present = [i for i in range(len(originals)) if i not in absent]

    def split_of(i: int) -> str:
        return children[originals[i][0]][1]

    # Patients: one per original, then planted pairs across ChestX-Det's train and test.
    patient = {i: number + 1 for number, i in enumerate(present)}
    trains = [i for i in present if split_of(i) == "train" and i not in reencoded]
    tests = [i for i in present if split_of(i) == "test" and i not in reencoded]
    pairs = zip(trains[: plan.shared_patients], tests[: plan.shared_patients], strict=False)
    for train, test in pairs:
        patient[test] = patient[train]
    # NIH's official lists are patient-wise: a patient's split follows its first film's
    # ChestX-Det split, except for the planted flips.
    patient_split: dict[int, str] = {}
    for i in present:
        patient_split.setdefault(patient[i], "train_val" if split_of(i) == "train" else "test")
    flips_test = [i for i in tests[plan.shared_patients :]][: plan.test_in_nih_train]
    flips_train = [i for i in trains[plan.shared_patients :]][: plan.train_in_nih_test]
    for i in flips_test:
        patient_split[patient[i]] = "train_val"
    for i in flips_train:
        patient_split[patient[i]] = "test"
    films: list[tuple[int, np.ndarray | None, int | None]] = [
        (patient[i], None, i) for i in present
    ]
    # Distractors: half new patients, half other films of ChestX-Det patients.
    next_patient = max(patient.values(), default=0) + 1
    for number in range(plan.distractors):
        pixels = to_uint8(
            render_radiograph(
                dataset_rng(seed, "nih_chestxray14", 1, number), NIH_SIDE, NIH_SIDE
            ).pixels
        )
        if number % 2 == 0 or not present:
            owner = next_patient
            patient_split[owner] = "train_val" if number % 4 == 0 else "test"
            next_patient += 1
        else:
            owner = patient[present[number % len(present)]]
        films.append((owner, pixels, None))
    follow_up: dict[int, int] = {}
    entries, links, folders = [], {}, {}
    for number, (owner, pixels, original) in enumerate(films):
        follow = follow_up.get(owner, 0)
        follow_up[owner] = follow + 1
        name = f"{owner:08d}_{follow:03d}.png"
        folder = f"images_{number % 2 + 1:03d}/images"
        if original is None:
            data = png_bytes(pixels)
        else:
            data = _nih_copy(children[originals[original][0]][2], kinds[original])
            for position in originals[original]:
                links[children[position][0]] = name
        write_bytes(root / folder / name, data)
        folders[name] = folder
        entries.append((name, owner, follow, patient_split[owner]))
    write_nih_metadata(root, entries)
    child_kinds = {}
    for i, positions in enumerate(originals):
        for position in positions:
            child_kinds[children[position][0]] = kinds[i]
            links.setdefault(children[position][0], None)
    return {
        "links": links,
        "kinds": child_kinds,
        "splits": {children[p][0]: children[p][1] for p in range(len(children))},
        "images": {name: {"patient": str(o), "split": s} for name, o, _, s in entries},
        "distractors": sorted(name for name, _ in folders.items() if name not in links.values()),
    }


def _nih_copy(child: Path, kind: str) -> bytes:
    """The NIH original of a ChestX-Det file: its bytes, or the film re-encoded."""
    data = child.read_bytes()
    if kind == "identical_file":
        return data
    pixels = decode_grayscale(child, target_size=1 << 14).pixels
    if kind == "near":
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=REENCODE_JPEG_QUALITY)
        with Image.open(io.BytesIO(buffer.getvalue())) as image:
            pixels = np.asarray(image.convert("L"))
    # Another PNG encoder setting: other bytes for the same pixels.
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def write_nih_metadata(root: Path, entries: list[tuple[str, int, int, str]]) -> None:
    """`Data_Entry_2017.csv` and the official split lists for (name, patient, follow-up,
    split) entries, in the real files' format."""
    lines = [_DATA_ENTRY_HEADER]
    for name, owner, follow, _ in sorted(entries):
        lines.append(
            f"{name},No Finding,{follow},{owner},{40 + owner % 40},M,PA,1024,1024,0.143,0.143\n"
        )
    write_text(root / "Data_Entry_2017.csv", "".join(lines))
    for split, file_name in SPLIT_LISTS.items():
        names = sorted(name for name, _, _, s in entries if s == split)
        write_text(root / file_name, "".join(f"{name}\n" for name in names))


# --- MIMIC-CXR's official split --------------------------------------------------------------


def _write_mimic_splits(environ: Mapping[str, str], plan: Plan) -> dict:
    """The split file: MS-CXR train/val/test as train/validate/test, with planted flips, one
    image left out, and another film of one MS-CXR test patient in train."""
    source = open_source("ms_cxr", SourceLocation(), environ)
    rows = []
    for split in source.splits:
        index = source.read_split(split).index
        rows += [
            (str(i).removeprefix("ms_cxr/"), str(s), str(p), split)
            for i, s, p in zip(
                index["image_id"], index["study_id"], index["patient_id"], strict=True
            )
        ]
    rows.sort()
    official = {
        dicom: {"train": "train", "val": "validate", "test": "test"}[s] for dicom, _, _, s in rows
    }
    tests = [dicom for dicom, _, _, s in rows if s == "test"]
    trains = [dicom for dicom, _, _, s in rows if s == "train"]
    vals = [dicom for dicom, _, _, s in rows if s == "val"]
    for dicom in tests[: plan.mimic_test_in_train]:
        official[dicom] = "train"
    for dicom in trains[: plan.mimic_train_in_test]:
        official[dicom] = "test"
    missing = vals[:1]
    for dicom in missing:
        del official[dicom]
    subject = {dicom: p for dicom, _, p, _ in rows}
    study = {dicom: s for dicom, s, _, _ in rows}
    extra = {}
    other_film_of = tests[plan.mimic_test_in_train : plan.mimic_test_in_train + 1]
    for dicom in other_film_of:
        extra_id = hashlib.sha1(f"extra-{dicom}".encode()).hexdigest()[:8]
        extra_id = "-".join(
            [extra_id, *(hashlib.sha1(f"{dicom}{k}".encode()).hexdigest()[:8] for k in range(4))]
        )
        extra[extra_id] = {
            "subject": subject[dicom],
            "study": str(int(study[dicom]) + 1),
            "split": "train",
        }
    lines = [",".join(SPLIT_COLUMNS)]
    for dicom in sorted(official):
        lines.append(f"{dicom},{study[dicom]},{subject[dicom]},{official[dicom]}")
    for dicom, row in sorted(extra.items()):
        lines.append(f"{dicom},{row['study']},{row['subject']},{row['split']}")
    mimic_root = Path(environ[DATA_ROOT_VARIABLE]) / "mimic-cxr"
    write_bytes(
        mimic_root / SPLIT_NAMES[0], gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    )
    return {
        "splits": official,
        "child_splits": {dicom: s for dicom, _, _, s in rows},
        "subjects": subject,
        "missing": missing,
        "extra": extra,
    }


# --- what the checks must find ---------------------------------------------------------------


def _expected(nih: dict, mimic: dict) -> dict:
    """Per check: the images it must report (computed from the plan, not by the pipeline)."""
    rows = []  # (image_id, child split, parent split, parent patient splits, patient)
    patient_splits: dict[str, set[str]] = {}
    for image in nih["images"].values():
        patient_splits.setdefault(image["patient"], set()).add(image["split"])
    for child, name in nih["links"].items():
        if name is None:
            continue
        image = nih["images"][name]
        rows.append(
            (
                child,
                nih["splits"][child],
                image["split"],
                patient_splits[image["patient"]],
                image["patient"],
                "nih",
            )
        )
    subject_splits: dict[str, set[str]] = {}
    for dicom, split in mimic["splits"].items():
        subject_splits.setdefault(mimic["subjects"][dicom], set()).add(split)
    for row in mimic["extra"].values():
        subject_splits.setdefault(row["subject"], set()).add(row["split"])
    for dicom, child_split in mimic["child_splits"].items():
        subject = mimic["subjects"][dicom]
        rows.append(
            (
                f"ms_cxr/{dicom}",
                child_split,
                mimic["splits"].get(dicom),
                subject_splits.get(subject, set()),
                subject,
                "mimic",
            )
        )
    train = {"nih": "train_val", "mimic": "train"}
    eval_in_train = sorted(r[0] for r in rows if r[1] in EVALUATION and r[2] == train[r[5]])
    eval_patients = sorted(r[0] for r in rows if r[1] in EVALUATION and train[r[5]] in r[3])
    train_in_test = sorted(r[0] for r in rows if r[1] == "train" and r[2] == "test")
    det_patients: dict[str, set[str]] = {}
    for r in rows:
        if r[5] == "nih":
            det_patients.setdefault(r[4], set()).add(r[1])
    shared = {p for p, splits in det_patients.items() if len(splits) > 1}
    return {
        "eval_images_in_parent_train": eval_in_train,
        "eval_patients_in_parent_train": eval_patients,
        "train_images_in_parent_test": train_in_test,
        "chestx_det_patients_across_splits": sorted(
            r[0] for r in rows if r[5] == "nih" and r[4] in shared
        ),
        "chestx_det_shared_patients": len(shared),
    }
