"""Deterministic miniature versions of the four datasets, in their real layouts and formats.

Used by tests, the demo and benchmarks; see `generate_datasets`.
"""

from __future__ import annotations

import importlib
import inspect
import numbers
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from radharmony_pipeline.sources import SOURCE_TYPES
from radharmony_pipeline.synthetic import ms_cxr, rexgradient
from radharmony_pipeline.synthetic.duplicates import PlantedDuplicate, plant_duplicates
from radharmony_pipeline.synthetic.files import staged_roots
from radharmony_pipeline.synthetic.parents import write_parents

# full: the documented counts (slow: hours of rendering for ReXGradient's 273,004 images;
# benchmarks/bench_corpus.py renders that corpus in parallel at a chosen pixel side).
SCALES = ("tiny", "small", "full")
MIMIC_FORMATS = ms_cxr.MIMIC_FORMATS

__all__ = [
    "MIMIC_FORMATS",
    "SCALES",
    "generate_datasets",
    "generated_datasets",
    "generated_partitions",
    "write_full_scale_rexgradient_metadata",
]


def generated_datasets() -> tuple[str, ...]:
    """The registered datasets that have a synthetic generator (each `DatasetSource` names
    its `synthetic_generator`, or None), in registry order: what `generate_datasets` writes
    by default."""
    return tuple(key for key, source in SOURCE_TYPES.items() if source.synthetic_generator)


def generated_partitions() -> list[str]:
    """The partitions of the datasets `generate_datasets` writes by default."""
    return [f"{key}.{split}" for key in generated_datasets() for split in SOURCE_TYPES[key].splits]


def generate_datasets(
    out: Path,
    scale: str = "tiny",
    seed: int = 0,
    datasets: Sequence[str] | None = None,
    mimic_format: str = "mixed",
    duplicates: Sequence[PlantedDuplicate] = (),
    parents: bool = False,
) -> dict[str, Path]:
    """Write the chosen datasets (default: every one with a generator) under `out`; return
    {dataset_key: dataset_root}.

    `scale` is tiny (tests: a few seconds for all four) or small (the demo); `mimic_format`
    picks jpg, dcm or mixed (per-file) for the MIMIC-CXR images under MS-CXR. The same seed
    gives byte-identical files. Each dataset is built in a hidden staging folder and swapped
    into place whole, so a crash never leaves half a dataset. `duplicates` are planted once
    every dataset is written, and listed in `out/duplicates_truth.json`. `parents` writes a
    miniature NIH ChestX-ray14 holding ChestX-Det's images and MIMIC-CXR's split file, their
    plants listed in `out/parents_truth.json` (needs chestx_det and ms_cxr).
    """
    chosen = _validated(scale, seed, datasets, mimic_format)
    if parents and not {"chestx_det", "ms_cxr"} <= set(chosen):
        raise ValueError("parents=True needs the chestx_det and ms_cxr datasets")
    out = Path(out)
    options = {"mimic_format": mimic_format}
    roots = {}
    for name in chosen:
        generator = _generator(name)
        # Options reach the generators that take them (the MIMIC format: MS-CXR's only).
        accepted = inspect.signature(generator.generate).parameters
        with staged_roots(out, name, generator.ROOTS) as stage:
            staged_root = generator.generate(
                stage, scale, seed, **{k: v for k, v in options.items() if k in accepted}
            )
        roots[name] = out / staged_root.relative_to(stage)
    if duplicates:
        plant_duplicates(out, duplicates)
    if parents:
        write_parents(out, scale, seed)
    return roots


def _generator(dataset: str) -> ModuleType:
    """The module writing `dataset`: `ROOTS` (its top folders) and `generate(out, scale, seed)`."""
    module = SOURCE_TYPES[dataset].synthetic_generator
    assert module is not None, "_validated keeps datasets without a generator out"
    return importlib.import_module(module)


def write_full_scale_rexgradient_metadata(out: Path, seed: int = 0) -> Path:
    """Real-size ReXGradient metadata JSONs without images; return the rexgradient root.

    Train 140,000 studies / 238,968 images / 95,716 patients, valid 10,000 / 17,007 / 6,964,
    test 10,000 / 17,029 / 6,807, with report text of realistic length.
    """
    _check_seed(seed)
    out = Path(out)
    with staged_roots(out, "rexgradient", rexgradient.ROOTS) as stage:
        staged_root = rexgradient.write_full_scale(stage, seed)
    return out / staged_root.relative_to(stage)


def _validated(
    scale: str, seed: int, datasets: Sequence[str] | None, mimic_format: str
) -> list[str]:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    if mimic_format not in MIMIC_FORMATS:
        raise ValueError(
            f"mimic_format must be one of {', '.join(MIMIC_FORMATS)}, got {mimic_format!r}"
        )
    _check_seed(seed)
    if isinstance(datasets, str):
        datasets = [datasets]
    generated = generated_datasets()
    chosen = list(generated if datasets is None else datasets)
    unknown = [name for name in chosen if name not in SOURCE_TYPES]
    if unknown:
        raise ValueError(
            f"unknown dataset(s) {', '.join(map(repr, unknown))}; "
            f"choose from {', '.join(generated)}"
        )
    without = [name for name in chosen if name not in generated]
    if without:
        raise ValueError(
            f"no synthetic generator for {', '.join(map(repr, without))} (its DatasetSource "
            f"names no synthetic_generator); choose from {', '.join(generated)}"
        )
    # Keep the caller's order but write each dataset once.
    return list(dict.fromkeys(chosen))


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
