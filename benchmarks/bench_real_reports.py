"""Benchmark: the report labeler on real radiologists' reports with hand-coded findings.

The input is a CSV of real reports (`findings`, `impression`) with gold positive labels
(`gold_<Disease>`, ChestX-ray14's names), such as the development half of the Indiana
University collection (Open-i) kept beside the project. It prints, per disease, precision /
recall / F1 of positive labels (as the ChestX-ray8 paper scored its labeler) and with uncertain
counted as positive, the micro figures over the seven diseases that paper scored, the share of
uncertain labels decided by a sentence that negates (a negated list), and the disagreements
grouped by class of error. Figures only go to `--json`; the texts never leave the input.

    .venv/bin/python benchmarks/bench_real_reports.py ../shared/real-reports/openi-development.csv
    .venv/bin/python benchmarks/bench_real_reports.py FILE --examples 5 --json results/real.json
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd

from radharmony_pipeline.processing.reports.agreement import positive_scores
from radharmony_pipeline.processing.reports.label_files import label_columns
from radharmony_pipeline.processing.reports.labeler import ReportLabeler
from radharmony_pipeline.vocabulary import NEGATIVE, POSITIVE, UNCERTAIN

# The diseases ChestX-ray8 (Wang et al. 2017, Table 2) scored its labeler on, with its F1.
CHESTXRAY8_F1 = {
    "atelectasis": 0.91,
    "cardiomegaly": 0.88,
    "pleural_effusion": 0.87,
    "mass": 0.52,
    "nodule": 0.75,
    "pneumonia": 0.77,
    "pneumothorax": 0.86,
}
GOLD_PREFIX = "gold_"
# A sentence that opens by denying what it lists ("No focal consolidation, effusion or ...").
_NEGATING_SENTENCE = re.compile(
    r"^\W*(?:\d+[.)]\s*)?(?:no|without|negative for|there (?:is|are|has been) no)\b", re.I
)
# What ends the reach of that denial inside the sentence.
_CLAUSE_BREAK = re.compile(r";|\b(?:but|however|although|though|whereas|which)\b", re.I)


def report_text(findings: object, impression: object) -> str:
    """The two sections as a report with headers (a missing section is left out)."""
    parts = [
        f"{header}:\n{text.strip()}"
        for header, text in (("FINDINGS", findings), ("IMPRESSION", impression))
        if isinstance(text, str) and text.strip()
    ]
    return "\n\n".join(parts)


def gold_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """The gold columns as report observations (1 present, 0 not coded)."""
    columns = label_columns(frame.astype("string"), prefix=GOLD_PREFIX)
    missing = set(CHESTXRAY8_F1) - set(columns)
    if missing:
        raise SystemExit(f"no gold column for {sorted(missing)}: is this the right file?")
    return pd.DataFrame(columns)


def negates(sentence: str) -> bool:
    """Whether a sentence denies what it names: it opens with a negation and no clause break
    follows."""
    return bool(_NEGATING_SENTENCE.search(sentence)) and not _CLAUSE_BREAK.search(sentence)


def error_class(value: int | None, gold: int, sentence: str) -> str:
    """The class of one disagreement between a label and the gold coding."""
    if gold == 1:
        return {NEGATIVE: "missed: read as negative", UNCERTAIN: "missed: read as uncertain"}.get(
            value, "missed: not mentioned"
        )
    return "extra: in a negating sentence" if negates(sentence) else "extra: positive, not coded"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", type=Path, help="CSV: findings, impression, gold_<Disease>")
    parser.add_argument("--examples", type=int, default=0, help="sentences shown per class")
    parser.add_argument("--json", type=Path, help="write the figures (no text) here")
    args = parser.parse_args()

    frame = pd.read_csv(args.reports, dtype="string", keep_default_na=False, na_values=[""])
    gold = gold_labels(frame)
    texts = [report_text(f, i) for f, i in zip(frame["findings"], frame["impression"], strict=True)]
    readings = ReportLabeler().read_many(texts)
    sentence_of = [{e.observation: e.sentence for e in r.evidence} for r in readings]
    predicted = pd.DataFrame({name: [r.labels[name] for r in readings] for name in gold.columns})

    diseases = list(CHESTXRAY8_F1)
    scores = positive_scores(predicted[diseases], gold[diseases])
    print(f"{len(frame)} reports from {args.reports.name}")
    print(f"{'disease':<18}{'positive P / R / F1':>24}{'uncertain as positive':>26}  ChestX-ray8")
    for name in [*diseases, "micro"]:
        strict, lenient = scores[name]["positive"], scores[name]["positive_or_uncertain"]
        reference = f"{CHESTXRAY8_F1[name]:.2f}" if name in CHESTXRAY8_F1 else ""
        print(f"{name:<18}{_prf(strict):>24}{_prf(lenient):>26}  {reference}")

    uncertain = [
        (i, name)
        for i, r in enumerate(readings)
        for name, value in r.labels.items()
        if value == UNCERTAIN
    ]
    from_negating = [(i, n) for i, n in uncertain if negates(sentence_of[i][n])]
    share = len(from_negating) / len(uncertain) if uncertain else 0.0
    print(
        f"uncertain labels from negating sentences: {len(from_negating)} of {len(uncertain)} "
        f"({share:.1%})"
    )

    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name in diseases:
        for i, (value, truth) in enumerate(zip(predicted[name], gold[name], strict=True)):
            said = None if pd.isna(value) else int(value)
            if (said == POSITIVE) != (truth == 1):
                sentence = sentence_of[i].get(name, "")
                groups[(name, error_class(said, truth, sentence))].append(sentence)
    print("disagreements (positives only) by class of error:")
    for (name, kind), sentences in sorted(groups.items(), key=lambda g: -len(g[1])):
        print(f"  {len(sentences):4d}  {name:<18}{kind}")
        for sentence, count in Counter(sentences).most_common(args.examples):
            print(f"          {count}x {sentence[:150]!r}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        figures = {
            "reports": len(frame),
            "scores": scores,
            "uncertain": len(uncertain),
            "uncertain_from_negating": len(from_negating),
            "disagreements": {f"{n}: {k}": len(s) for (n, k), s in groups.items()},
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


def _prf(figures: dict[str, float]) -> str:
    return f"{figures['precision']:.2f} / {figures['recall']:.2f} / {figures['f1']:.2f}"


if __name__ == "__main__":
    main()
