"""The corpus a rehearsal runs on: the four datasets at a size's share of the documented
counts, ReXGradient and an NIH parent rendered in parallel (bench_corpus.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from radharmony_pipeline.sources.nih_chestxray14 import FOLDER as NIH_FOLDER
from radharmony_pipeline.synthetic import generate_datasets, rexgradient
from radharmony_pipeline.synthetic.encoding import png_bytes
from radharmony_pipeline.synthetic.files import write_bytes
from radharmony_pipeline.synthetic.parents import write_nih_metadata
from radharmony_pipeline.synthetic.radiograph import render_radiograph, to_uint8
from radharmony_pipeline.synthetic.seeding import dataset_rng

# Datasets whose documented counts are small: written whole at every size.
WHOLE_DATASETS = ("chexlocalize", "ms_cxr", "chestx_det")


NIH_FILMS = 112_120


NIH_FOLDER_FILMS = 10_000  # the real release: images_001/ … images_012/, ≤ 10,000 films each


TRAIN_SOURCES = "rexgradient_train_sources.txt"  # under the size's data folder


# zlib level 1 for the rendered films: level 6 spent 5.3 of 8.8 ms per 192² film here, for
# 15 % smaller files; what the rehearsal measures is per-file cost, not these bytes.
FILM_PNG_LEVEL = 1


def write_corpus(
    data: Path, work: Path, fraction: float, largest: float, side: int, seed: int, workers: int
) -> dict[str, int]:
    """The four datasets and the NIH parent under `data`; return their image counts.

    Each size is a share of one corpus rendered once under `work` at the largest size asked:
    the datasets written whole, hard-linked; ReXGradient's first studies of each split (its
    metadata written for them) and the NIH parent's first films, their files hard-linked
    from the render (the pipeline only reads its data roots). Sizes differ in count only."""
    link_whole_datasets(work / "whole_datasets", data, seed)
    films = work / "films"
    plan = rexgradient.plan_studies(seed, rexgradient.FULL_SCALE, (side, side + side // 4))
    render_films(films, first_studies(plan, largest), data, side, seed, workers, largest)
    share = first_studies(plan, fraction)
    root = data / "rexgradient"
    rexgradient.write_planned_metadata(root, share)
    train = []
    for split, studies in share.items():
        for _, study in studies:
            for path in study["ImagePath"]:
                relative = path.removeprefix(rexgradient.IMAGE_PREFIX)
                target = _mkdir((root / "deid_png" / relative).parent) / Path(relative).name
                os.link(films / "rexgradient" / "deid_png" / relative, target)
                if split == "train":
                    train.append(target)
    (data / TRAIN_SOURCES).write_text("\n".join(map(str, train)))
    images = sum(len(study["ImagePath"]) for studies in share.values() for _, study in studies)
    return {"rexgradient": images, "nih": _write_nih(data, films, round(NIH_FILMS * fraction))}


def link_whole_datasets(whole: Path, data: Path, seed: int) -> None:
    done = whole / "complete"
    if not done.exists():
        shutil.rmtree(whole, ignore_errors=True)
        generate_datasets(whole / "data", "full", seed, datasets=list(WHOLE_DATASETS))
        done.touch()
    data.mkdir(parents=True, exist_ok=True)
    for entry in (whole / "data").iterdir():
        subprocess.run(["cp", "-al", str(entry), str(data / entry.name)], check=True)


def first_studies(plan: dict, fraction: float) -> dict:
    """The first `fraction` of each split's studies (at least two): the same films at every
    size, so a smaller size is a part of a larger one."""
    return {
        split: studies[: max(2, round(len(studies) * fraction))] for split, studies in plan.items()
    }


def render_films(
    films: Path, plan: dict, data: Path, side: int, seed: int, workers: int, fraction: float
) -> None:
    """Every ReXGradient film of `plan` and the NIH distractors (NIH's films beyond
    ChestX-Det's originals) of `fraction` of its count, in parallel, once: `films`/complete
    holds the fraction of a finished render, which serves every size up to it."""
    done = films / "complete"
    if done.exists() and float(done.read_text() or 1) >= fraction:
        return
    shutil.rmtree(films, ignore_errors=True)
    distractors = max(0, round(NIH_FILMS * fraction) - len(chestx_det_films(data)))
    with ProcessPoolExecutor(workers) as pool:
        jobs = []
        for split_index, split in enumerate(rexgradient.SPLIT_FILES):
            first = 0
            for chunk in _chunks(plan[split], 500):
                jobs.append(
                    pool.submit(
                        rexgradient.write_images,
                        films / "rexgradient",
                        seed,
                        split_index,
                        chunk,
                        first,
                        FILM_PNG_LEVEL,
                    )
                )
                first += sum(len(study["ImagePath"]) for _, study in chunk)
        jobs += [
            pool.submit(_render_nih_films, films / "nih", seed, side, chunk)
            for chunk in _chunks(list(range(distractors)), 2000)
        ]
        for job in jobs:
            job.result()
    done.write_text(f"{fraction:g}")


def chestx_det_films(data: Path) -> list[Path]:
    return sorted((data / "chestx-det").glob("*/*.png"))


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _write_nih(data: Path, films: Path, count: int) -> int:
    """ChestX-Det's files as their NIH originals plus the first rendered distractors, with the
    real Data_Entry_2017.csv and split lists; the film count."""
    root = data / NIH_FOLDER
    children = chestx_det_films(data)
    entries = []
    for number, child in enumerate(children):
        name = f"{number + 1:08d}_000.png"
        os.link(child, _mkdir(root / _nih_folder(number)) / name)
        entries.append(
            (name, number + 1, 0, "test" if child.parent.name == "test" else "train_val")
        )
    first_patient = len(children) + 1
    for number in range(max(0, count - len(children))):
        patient = first_patient + number // 2
        name = f"{patient:08d}_{number % 2:03d}.png"
        folder = _mkdir(root / _nih_folder(len(children) + number))
        os.link(films / "nih" / f"{number:07d}.png", folder / name)
        split = "test" if patient % 5 == 0 else "train_val"
        entries.append((name, patient, number % 2, split))
    write_nih_metadata(root, entries)
    return len(entries)


def _render_nih_films(folder: Path, seed: int, side: int, numbers: list[int]) -> None:
    for number in numbers:
        rng = dataset_rng(seed, "nih_chestxray14", 1, number)
        pixels = to_uint8(render_radiograph(rng, side, side).pixels)
        write_bytes(folder / f"{number:07d}.png", png_bytes(pixels, FILM_PNG_LEVEL))


def _nih_folder(number: int) -> str:
    return f"images_{number // NIH_FOLDER_FILMS + 1:03d}/images"


def _mkdir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder
