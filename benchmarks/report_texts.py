"""Synthetic report texts in ReXGradient's format, seeded: what bench_report_labels.py times
the labeler on (its real texts are not in the project)."""

from __future__ import annotations

import numpy as np


def _words(joined: str) -> tuple[str, ...]:
    return tuple(joined.split("|"))


SIDES = ("right", "left")
BOTH = ("right", "left", "bilateral")
LOBES = ("upper", "middle", "lower")
ZONES = _words("base|apex|midlung|perihilar region|retrocardiac region|lung base")
SIZES = _words("trace|tiny|small|small to moderate|moderate|large")
DEGREES = _words("minimal|mild|mild to moderate|moderate|severe")
COURSES = _words(
    "unchanged|stable|decreased|increased|improving|improved|persistent|slightly larger|"
    "slightly smaller|worsening|new"
)
COURSE_CLAUSES = _words(
    "compared with the prior study|since the prior exam|from {n} days ago|since yesterday|"
    "from the study of {month}/{day}"
)
DEVICES = _words(
    "endotracheal tube|enteric tube|nasogastric tube|right internal jugular central venous "
    "catheter|left internal jugular central venous catheter|right PICC|left PICC|left chest "
    "tube|right chest tube|tracheostomy tube|feeding tube"
)
DEVICE_TIPS = _words(
    "{n} cm above the carina|at the cavoatrial junction|in the lower SVC|in the mid SVC|below "
    "the diaphragm|in the stomach|at the level of the clavicular heads"
)
SYMPTOMS = _words(
    "cough|fever|shortness of breath|chest pain|hypoxia|weakness|wheezing|hemoptysis|fall|"
    "sepsis|tachycardia|preoperative evaluation|line placement|follow-up of pneumonia"
)
NORMAL = _words(
    "The lungs are clear.|No pneumothorax.|No pleural effusion or pneumothorax.|The "
    "cardiomediastinal silhouette is within normal limits.|Heart size is normal.|No focal "
    "consolidation.|The osseous structures are intact.|No acute osseous abnormality.|The "
    "visualized upper abdomen is unremarkable.|Lungs are well expanded and clear.|No focal "
    "consolidation, pleural effusion, or pneumothorax.|Pulmonary vasculature is within normal "
    "limits."
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
        details = {
            0: lambda: f", {self.course()}",
            1: lambda: f", measuring {self.cm()}",
            2: lambda: (
                f" at the level of the {self.pick(SIDES)} {self.number(2, 11)}th posterior rib"
            ),
            3: lambda: f" on the {self.pick(('frontal', 'lateral', 'AP', 'PA'))} view",
            4: lambda: f" (previously {self.cm()})",
            5: lambda: f", {self.since()}",
        }
        return details[kind]() if kind in details else ""

    def where(self) -> str:
        if self.rng.random() < 0.5:
            return f"{self.pick(SIDES)} {self.pick(LOBES)} lobe"
        return f"{self.pick(BOTH)} {self.pick(ZONES)}"

    def tip(self) -> str:
        return self.pick(DEVICE_TIPS).format(n=self.number(2, 8))

    def degree(self) -> str:
        return self.pick(DEGREES).capitalize()


# Finding sentences with slots: each call draws its own values.
TEMPLATES = (
    lambda d: f"There is a {d.pick(SIZES)} {d.pick(BOTH)} pleural effusion, {d.course()}.",
    lambda d: f"{d.degree()} atelectasis in the {d.where()}.",
    lambda d: f"Patchy opacity in the {d.where()} may represent pneumonia.",
    lambda d: f"{d.pick(DEVICES).capitalize()} with tip {d.tip()}.",
    lambda d: f"The {d.pick(DEVICES)} terminates {d.tip()}, {d.pick(COURSES)}.",
    lambda d: f"A {d.cm()} nodule in the {d.where()} is {d.pick(COURSES)}.",
    lambda d: f"{d.degree()} cardiomegaly, {d.course()}.",
    lambda d: f"No {d.pick(SIDES)} pneumothorax after {d.pick(DEVICES)} placement.",
    lambda d: f"{d.pick(SIZES).capitalize()} {d.pick(SIDES)} apical pneumothorax, {d.course()}.",
    lambda d: (
        f"Healed fractures of the {d.pick(SIDES)} ribs {d.number(3, 7)} through {d.number(7, 11)}."
    ),
    lambda d: f"Acute nondisplaced fracture of the {d.pick(SIDES)} {d.number(3, 11)}th rib.",
    lambda d: f"{d.degree()} pulmonary edema, {d.course()}.",
    lambda d: f"Consolidation in the {d.where()} concerning for pneumonia.",
    lambda d: f"Cannot exclude a {d.pick(SIZES)} {d.pick(SIDES)} effusion.",
    lambda d: (
        f"No focal consolidation in the {d.where()}; {d.pick(SIZES)} {d.pick(SIDES)} effusion."
    ),
    lambda d: f"Calcified granuloma measuring {d.cm()} in the {d.where()}.",
    lambda d: f"Compression deformity of T{d.number(4, 13)}, {d.pick(COURSES)}.",
    lambda d: f"Opacities in the {d.where()}, atelectasis versus pneumonia.",
    lambda d: f"The {d.pick(DEVICES)} has been removed; no residual {d.pick(SIDES)} pneumothorax.",
    lambda d: f"{d.degree()} emphysema with {d.pick(SIDES)} apical pleural thickening.",
    lambda d: f"A {d.cm()} mass in the {d.where()}, {d.course()}.",
    lambda d: (
        f"{d.degree()} interstitial opacities in the {d.where()}, possibly edema or "
        "atypical infection."
    ),
    lambda d: f"Heart size is {d.pick(DEGREES)}ly enlarged, {d.pick(COURSES)}.",
    lambda d: f"The {d.pick(SIDES)} costophrenic angle is sharp; no effusion {d.since()}.",
    lambda d: f"Lung volumes are low with {d.pick(DEGREES)} {d.pick(BOTH)} basilar atelectasis.",
    lambda d: f"{d.pick(SIZES).capitalize()} {d.pick(SIDES)} effusion has resolved {d.since()}.",
    lambda d: (
        f"Postoperative changes of the {d.pick(SIDES)} hemithorax with {d.pick(DEGREES)} "
        "pleural thickening."
    ),
    lambda d: f"Mild degenerative changes of the thoracic spine at T{d.number(4, 13)}.",
    lambda d: f"{d.degree()} fibrotic changes in the {d.where()}, {d.pick(COURSES)}.",
    lambda d: f"{d.degree()} aortic calcification.",
)


def report_texts(count: int, seed: int = 31) -> list[str]:
    """`count` distinct report texts in ReXGradient's format (INDICATION / COMPARISON /
    FINDINGS / IMPRESSION; sentences from the templates, with sides, lobes, sizes,
    measurements, devices and course words; seeded)."""
    from radharmony_pipeline.sources.rexgradient import format_report

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
