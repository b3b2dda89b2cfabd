"""Benchmark: the report labeler's agreement with the labelled sets and its speed.

* **agreement**: the CheXpert paper's scores (mention, negation and uncertainty F1) plus
  positive and no-finding F1, micro-averaged over every (text, observation) pair, on the
  held-out part of `tests/data/report_labels/` (the targets of issue 31: positive >= 0.90,
  negation >= 0.85, uncertainty >= 0.70, no finding >= 0.85) and on the development part;
* **speed**: N distinct report texts in ReXGradient's format (INDICATION / COMPARISON /
  FINDINGS / IMPRESSION, sentences built from varied templates, sides, lobes, sizes,
  measurements, devices and course words; seeded), timed as a spaCy tokenizer-only pass over
  them (the floor: `nlp.tokenizer.pipe` on the blank English pipeline) and, right after it,
  `ReportLabeler.read_many` over the same texts with a fresh labeler (its piece cache empty);
  `--repeats` such pairs, the wall seconds of each and the median of the paired ratios. The
  targets: <= 120 s for 160,000 texts and <= 2x the floor;
* **table** (only when asked for; formerly bench_report_table.py): the `report_labels` step
  around the labeler on full-scale synthetic ReXGradient metadata (written once under
  --keep), each timed in wall seconds: the first build (every distinct report read, the rows
  conformed to the declared schema and written as Parquet; `--labeler stand-in`, the default,
  returns at once, so the figure is the step's own cost on top of the labeler, `--labeler
  real` reads them) and the unchanged rerun (the previous table read back, nothing read, the
  same rows conformed and written: the target is seconds).

    .venv/bin/python benchmarks/bench_report_labels.py [--texts 160000] [--repeats 2]
    .venv/bin/python benchmarks/bench_report_labels.py --sections agreement
    .venv/bin/python benchmarks/bench_report_labels.py --sections table [--split train]
        [--keep DIR] [--labeler stand-in]
    .venv/bin/python benchmarks/bench_report_labels.py --smoke   # every section, tiny
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import spacy
from common import add_smoke, write_rexgradient_metadata

from radharmony_pipeline.processing.reports.agreement import (
    agreement_scores,
    format_agreement,
    read_labelled_reports,
    reading_labels,
)
from radharmony_pipeline.processing.reports.labeler import ReportLabeler
from radharmony_pipeline.processing.reports.report_table import LabelledReports, label_reports
from radharmony_pipeline.processing.reports.sections import read_text, sentence_pieces
from radharmony_pipeline.processing.tables.table_schemas import REPORT_LABELS, conform
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.sources.rexgradient import format_report

LABELLED = Path(__file__).resolve().parents[1] / "tests" / "data" / "report_labels"
TARGETS = {"positive_f1": 0.90, "negation_f1": 0.85, "uncertainty_f1": 0.70, "no_finding_f1": 0.85}
WALL_TARGET_S = 120.0
RATIO_TARGET = 2.0
REXGRADIENT_REPORTS = 160_000

SIDES = ("right", "left")
BOTH = ("right", "left", "bilateral")
LOBES = ("upper", "middle", "lower")
ZONES = ("base", "apex", "midlung", "perihilar region", "retrocardiac region", "lung base")
SIZES = ("trace", "tiny", "small", "small to moderate", "moderate", "large")
DEGREES = ("minimal", "mild", "mild to moderate", "moderate", "severe")
COURSES = (
    "unchanged",
    "stable",
    "decreased",
    "increased",
    "improving",
    "improved",
    "persistent",
    "slightly larger",
    "slightly smaller",
    "worsening",
    "new",
)
COURSE_CLAUSES = (
    "compared with the prior study",
    "since the prior exam",
    "from {n} days ago",
    "since yesterday",
    "from the study of {month}/{day}",
)
DEVICES = (
    "endotracheal tube",
    "enteric tube",
    "nasogastric tube",
    "right internal jugular central venous catheter",
    "left internal jugular central venous catheter",
    "right PICC",
    "left PICC",
    "left chest tube",
    "right chest tube",
    "tracheostomy tube",
    "feeding tube",
)
DEVICE_TIPS = (
    "{n} cm above the carina",
    "at the cavoatrial junction",
    "in the lower SVC",
    "in the mid SVC",
    "below the diaphragm",
    "in the stomach",
    "at the level of the clavicular heads",
)
SYMPTOMS = (
    "cough",
    "fever",
    "shortness of breath",
    "chest pain",
    "hypoxia",
    "weakness",
    "wheezing",
    "hemoptysis",
    "fall",
    "sepsis",
    "tachycardia",
    "preoperative evaluation",
    "line placement",
    "follow-up of pneumonia",
)
NORMAL = (
    "The lungs are clear.",
    "No pneumothorax.",
    "No pleural effusion or pneumothorax.",
    "The cardiomediastinal silhouette is within normal limits.",
    "Heart size is normal.",
    "No focal consolidation.",
    "The osseous structures are intact.",
    "No acute osseous abnormality.",
    "The visualized upper abdomen is unremarkable.",
    "Lungs are well expanded and clear.",
    "No focal consolidation, pleural effusion, or pneumothorax.",
    "Pulmonary vasculature is within normal limits.",
)


class _Draw:
    """Seeded draws of slot values."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def pick(self, options: tuple[str, ...]) -> str:
        return options[self.rng.integers(len(options))]

    def number(self, low: int, high: int) -> int:
        return int(self.rng.integers(low, high))

    def cm(self) -> str:
        return f"{self.rng.integers(3, 80) / 10:.1f} cm"

    def since(self) -> str:
        return self.pick(COURSE_CLAUSES).format(
            n=self.number(1, 30), month=self.number(1, 13), day=self.number(1, 29)
        )

    def course(self) -> str:
        return f"{self.pick(COURSES)} {self.since()}"

    def detail(self) -> str:
        """A trailing detail most finding sentences carry, often with a number."""
        kind = self.number(0, 8)
        if kind == 0:
            return f", {self.course()}"
        if kind == 1:
            return f", measuring {self.cm()}"
        if kind == 2:
            return f" at the level of the {self.pick(SIDES)} {self.number(2, 11)}th posterior rib"
        if kind == 3:
            return f" on the {self.pick(('frontal', 'lateral', 'AP', 'PA'))} view"
        if kind == 4:
            return f" (previously {self.cm()})"
        if kind == 5:
            return f", {self.since()}"
        return ""

    def where(self) -> str:
        if self.rng.random() < 0.5:
            return f"{self.pick(SIDES)} {self.pick(LOBES)} lobe"
        return f"{self.pick(BOTH)} {self.pick(ZONES)}"


# Finding sentences with slots: each call draws its own values.
TEMPLATES = (
    lambda d: f"There is a {d.pick(SIZES)} {d.pick(BOTH)} pleural effusion, {d.course()}.",
    lambda d: f"{d.pick(DEGREES).capitalize()} atelectasis in the {d.where()}.",
    lambda d: f"Patchy opacity in the {d.where()} may represent pneumonia.",
    lambda d: (
        f"{d.pick(DEVICES).capitalize()} with tip {d.pick(DEVICE_TIPS).format(n=d.number(2, 8))}."
    ),
    lambda d: (
        f"The {d.pick(DEVICES)} terminates {d.pick(DEVICE_TIPS).format(n=d.number(2, 8))}, "
        f"{d.pick(COURSES)}."
    ),
    lambda d: f"A {d.cm()} nodule in the {d.where()} is {d.pick(COURSES)}.",
    lambda d: f"{d.pick(DEGREES).capitalize()} cardiomegaly, {d.course()}.",
    lambda d: f"No {d.pick(SIDES)} pneumothorax after {d.pick(DEVICES)} placement.",
    lambda d: f"{d.pick(SIZES).capitalize()} {d.pick(SIDES)} apical pneumothorax, {d.course()}.",
    lambda d: (
        f"Healed fractures of the {d.pick(SIDES)} ribs {d.number(3, 7)} through {d.number(7, 11)}."
    ),
    lambda d: f"Acute nondisplaced fracture of the {d.pick(SIDES)} {d.number(3, 11)}th rib.",
    lambda d: f"{d.pick(DEGREES).capitalize()} pulmonary edema, {d.course()}.",
    lambda d: f"Consolidation in the {d.where()} concerning for pneumonia.",
    lambda d: f"Cannot exclude a {d.pick(SIZES)} {d.pick(SIDES)} effusion.",
    lambda d: (
        f"No focal consolidation in the {d.where()}; {d.pick(SIZES)} {d.pick(SIDES)} effusion."
    ),
    lambda d: f"Calcified granuloma measuring {d.cm()} in the {d.where()}.",
    lambda d: f"Compression deformity of T{d.number(4, 13)}, {d.pick(COURSES)}.",
    lambda d: f"Opacities in the {d.where()}, atelectasis versus pneumonia.",
    lambda d: f"The {d.pick(DEVICES)} has been removed; no residual {d.pick(SIDES)} pneumothorax.",
    lambda d: (
        f"{d.pick(DEGREES).capitalize()} emphysema with {d.pick(SIDES)} apical pleural thickening."
    ),
    lambda d: f"A {d.cm()} mass in the {d.where()}, {d.course()}.",
    lambda d: (
        f"{d.pick(DEGREES).capitalize()} interstitial opacities in the {d.where()}, "
        "possibly edema or atypical infection."
    ),
    lambda d: f"Heart size is {d.pick(DEGREES)}ly enlarged, {d.pick(COURSES)}.",
    lambda d: f"The {d.pick(SIDES)} costophrenic angle is sharp; no effusion {d.since()}.",
    lambda d: f"Lung volumes are low with {d.pick(DEGREES)} {d.pick(BOTH)} basilar atelectasis.",
    lambda d: f"{d.pick(SIZES).capitalize()} {d.pick(SIDES)} effusion has resolved {d.since()}.",
    lambda d: (
        f"Postoperative changes of the {d.pick(SIDES)} hemithorax with "
        f"{d.pick(DEGREES)} pleural thickening."
    ),
    lambda d: f"Mild degenerative changes of the thoracic spine at T{d.number(4, 13)}.",
    lambda d: (
        f"{d.pick(DEGREES).capitalize()} fibrotic changes in the {d.where()}, {d.pick(COURSES)}."
    ),
    lambda d: f"{d.pick(DEGREES).capitalize()} aortic calcification.",
)


def report_texts(count: int, seed: int = 31) -> list[str]:
    """`count` distinct report texts in the ReXGradient format (seeded)."""
    draw = _Draw(seed)
    rng = draw.rng
    texts: dict[str, None] = {}
    while len(texts) < count:
        chosen = [
            f"{TEMPLATES[i](draw)[:-1]}{draw.detail()}."
            for i in rng.choice(len(TEMPLATES), rng.integers(1, 5))
        ]
        chosen += [NORMAL[i] for i in rng.choice(len(NORMAL), rng.integers(1, 5), replace=False)]
        order = rng.permutation(len(chosen))
        findings = " ".join(chosen[i] for i in order)
        pool = [*chosen[:2], "No acute cardiopulmonary process."]
        if rng.random() < 0.3:
            numbered = rng.permutation(len(pool))[:2]
            impression = "\n".join(f"{n}. {pool[i]}" for n, i in enumerate(numbered, start=1))
        else:
            impression = pool[rng.integers(len(pool))]
        indication = f"{draw.number(18, 95)}-year-old with {draw.pick(SYMPTOMS)}."
        comparison = (
            "None."
            if rng.random() < 0.4
            else f"Chest radiograph from {draw.number(1, 400)} days prior."
        )
        texts[format_report([indication, comparison, findings, impression])] = None
    return list(texts)


def agreement_section() -> bool:
    labeler = ReportLabeler()
    passed = True
    for part in ("held_out", "development"):
        texts, reference = read_labelled_reports(LABELLED / f"{part}.csv")
        scores = agreement_scores(reading_labels(labeler.read_many(texts)), reference)
        print(f"\n== agreement: {part}.csv ({len(texts)} texts) ==")
        print(format_agreement(scores))
        if part == "held_out":
            for name, target in TARGETS.items():
                ok = scores[name] >= target
                passed &= ok
                print(f"{'PASS' if ok else 'FAIL'} {name} {scores[name]:.3f} (target >= {target})")
    return passed


def tokenizer_floor(texts: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of a tokenizer-only pass."""
    nlp = spacy.blank("en")
    start, cpu = time.perf_counter(), time.process_time()
    for doc in nlp.tokenizer.pipe(texts, batch_size=1000):
        len(doc)
    return time.perf_counter() - start, time.process_time() - cpu


def labeler_pass(texts: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of `read_many` with a fresh labeler (built before the clock)."""
    labeler = ReportLabeler()
    start, cpu = time.perf_counter(), time.process_time()
    labeler.read_many(texts)
    return time.perf_counter() - start, time.process_time() - cpu


def speed_section(count: int, repeats: int) -> bool:
    start = time.perf_counter()
    texts = report_texts(count)
    generated = time.perf_counter() - start
    pieces = [p for t in texts if (read := read_text(t)) for p in sentence_pieces(read)]
    print(f"\n== speed: {len(texts):,} distinct report texts (generated in {generated:.1f} s) ==")
    print(
        f"mean {np.mean([len(t) for t in texts]):.0f} characters; {len(pieces):,} sentence "
        f"pieces read, {len(set(pieces)):,} distinct ({len(set(pieces)) / len(pieces):.0%})"
    )
    print(
        "labeler: one process (n_process=1); identical pieces read once; a piece without a "
        "mention word skips the spaCy pipeline"
    )
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    floors, labels, ratios, cpu_ratios = [], [], [], []
    for repeat in range(repeats):
        floor, floor_cpu = tokenizer_floor(texts)
        labelled, labelled_cpu = labeler_pass(texts)
        floors.append(floor)
        labels.append(labelled)
        ratios.append(labelled / floor)
        cpu_ratios.append(labelled_cpu / floor_cpu)
        print(
            f"pair {repeat + 1}: tokenizer floor {floor:.1f} s (CPU {floor_cpu:.1f} s), "
            f"labeler {labelled:.1f} s (CPU {labelled_cpu:.1f} s), ratio {ratios[-1]:.2f}x "
            f"(CPU {cpu_ratios[-1]:.2f}x)"
        )
    ratio = statistics.median(ratios)
    wall = statistics.median(labels)
    scaled = wall * REXGRADIENT_REPORTS / len(texts)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(
        f"labeler median {wall:.1f} s ({len(texts) / wall:,.0f} texts/s; {scaled:.1f} s for "
        f"{REXGRADIENT_REPORTS:,}), floor median {statistics.median(floors):.1f} s, paired "
        f"ratios {min(ratios):.2f}-{max(ratios):.2f}x, median {ratio:.2f}x "
        f"(CPU {statistics.median(cpu_ratios):.2f}x)"
    )
    wall_ok, ratio_ok = scaled <= WALL_TARGET_S, ratio <= RATIO_TARGET
    print(f"{'PASS' if wall_ok else 'FAIL'} wall {scaled:.1f} s (target <= {WALL_TARGET_S:.0f} s)")
    print(f"{'PASS' if ratio_ok else 'FAIL'} ratio {ratio:.2f}x (target <= {RATIO_TARGET:.0f}x)")
    return wall_ok and ratio_ok


@dataclass(frozen=True)
class _Reading:
    labels: dict
    evidence: tuple
    mentioned: bool


class StandInReader:
    """Returns one fixed reading per text at once: the step's cost without the labeler's."""

    def read_many(self, texts: Sequence[str]) -> list[_Reading]:
        reading = _Reading({"no_finding": 1}, (), False)
        return [reading] * len(texts)


def written(result: LabelledReports, split: str) -> bytes:
    table = conform(result.table, REPORT_LABELS, {"dataset": "rexgradient", "split": split})
    sink = io.BytesIO()
    pq.write_table(table, sink, write_page_checksum=True)
    return sink.getvalue()


def table_section(split: str, labeler: str, folder: Path, smoke: bool) -> None:
    """The `report_labels` step around the labeler (formerly bench_report_table.py)."""
    print(f"\n== table: rexgradient {split}, {labeler} reader ==")
    root = folder / "rexgradient"
    if not root.exists():
        print(f"writing ReXGradient metadata under {folder} ...", flush=True)
        root = write_rexgradient_metadata(folder, smoke)
    # Metadata only: the reader wants the image folder to exist, not to hold the images.
    (root / "deid_png").mkdir(exist_ok=True)
    source = open_source("rexgradient", SourceLocation(root=root))
    labels = source.read_split(split).labels
    reader = ReportLabeler() if labeler == "real" else StandInReader()

    start = time.perf_counter()
    first = label_reports(labels["image_id"], labels["report"], reader, "bench")
    content = written(first, split)
    first_s = time.perf_counter() - start

    start = time.perf_counter()
    previous = pq.read_table(io.BytesIO(content))
    again = label_reports(labels["image_id"], labels["report"], reader, "bench", previous)
    written(again, split)
    rerun_s = time.perf_counter() - start

    assert again.labelled == 0 and again.reused == first.distinct_reports
    print(
        f"rexgradient {split}: {len(first.table):,} images with a report, "
        f"{first.distinct_reports:,} distinct reports ({labeler} reader)"
    )
    print(f"first build     {first_s:7.1f} s  ({first.labelled:,} texts read)")
    print(
        f"unchanged rerun {rerun_s:7.1f} s  ({again.labelled} texts read, {again.reused:,} reused)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=REXGRADIENT_REPORTS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=("agreement", "speed", "table"),
        default=["agreement", "speed"],
    )
    parser.add_argument("--split", default="train", choices=("train", "val", "test"))
    parser.add_argument("--keep", type=Path, help="table: folder for the metadata (reused)")
    parser.add_argument("--labeler", choices=("stand-in", "real"), default="stand-in")
    add_smoke(parser)
    args = parser.parse_args()
    if args.smoke:
        args.texts, args.repeats, args.keep = 300, 1, None
        args.sections = ["agreement", "speed", "table"]
    passed = True
    if "agreement" in args.sections:
        passed &= agreement_section()
    if "speed" in args.sections:
        passed &= speed_section(args.texts, args.repeats)
    if "table" in args.sections:
        with tempfile.TemporaryDirectory(prefix="bench-report-table-") as scratch:
            table_section(args.split, args.labeler, args.keep or Path(scratch), args.smoke)
    raise SystemExit(0 if passed or args.smoke else 1)


if __name__ == "__main__":
    main()
