"""Four-section radiology report text (Indication, Comparison, Findings, Impression)."""

from __future__ import annotations

import numpy as np

INDICATIONS = (
    "Cough and fever.",
    "Shortness of breath.",
    "Chest pain.",
    "Preoperative evaluation.",
    "Follow-up of pneumonia.",
    "Hypoxia.",
    "Trauma, rule out pneumothorax.",
    "Line placement.",
    "Wheezing.",
    "Fever of unknown origin.",
    "Status post intubation.",
    "Congestive heart failure exacerbation.",
    "Abnormal breath sounds.",
    "Weakness.",
)
FINDINGS = (
    "The lungs are clear without focal consolidation.",
    "There is no pleural effusion or pneumothorax.",
    "The cardiomediastinal silhouette is within normal limits.",
    "Heart size is mildly enlarged.",
    "There is patchy opacity in the right lower lobe.",
    "Mild interstitial prominence is noted bilaterally.",
    "A small left pleural effusion is present with adjacent atelectasis.",
    "The osseous structures are intact without acute fracture.",
    "An endotracheal tube terminates 4 cm above the carina.",
    "A right internal jugular central venous catheter tip projects over the SVC.",
    "There is blunting of the right costophrenic angle.",
    "Lung volumes are low with bibasilar atelectasis.",
    "No focal airspace disease is identified.",
    "The visualized upper abdomen is unremarkable.",
    "Degenerative changes of the thoracic spine are noted.",
    "There is a 1 cm nodular opacity in the left upper lobe.",
)
IMPRESSIONS = (
    "No acute cardiopulmonary process.",
    "Right lower lobe pneumonia.",
    "Small left pleural effusion with adjacent atelectasis.",
    "Mild pulmonary edema.",
    "Cardiomegaly without acute decompensation.",
    "Support devices in satisfactory position.",
    "Bibasilar atelectasis, otherwise no acute process.",
    "Stable chest radiograph.",
    "Left upper lobe nodule; CT chest recommended for further evaluation.",
)
COMPARISONS = (
    "None.",
    "Prior chest radiograph.",
    "Chest radiograph from 2 days prior.",
    "CT chest from last year.",
    "Outside films not available.",
)


def sentences(
    rng: np.random.Generator, pool: tuple[str, ...], count: int, low: int, high: int
) -> list[str]:
    """`count` texts, each of `low` to `high` different sentences drawn from `pool`."""
    lengths = rng.integers(low, high + 1, size=count).tolist()
    # Sorting random keys gives each text its own order of the pool without repeats.
    picks = np.argsort(rng.random((count, len(pool))), axis=1)[:, :high].tolist()
    return [" ".join(pool[i] for i in row[:n]) for row, n in zip(picks, lengths, strict=True)]
