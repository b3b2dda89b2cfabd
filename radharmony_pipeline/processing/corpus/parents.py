"""Provenance to the parent datasets: their split names, matching child images to parent
images by content, and the evaluation leaks found against the parents' official splits."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.imaging.perceptual_hash import (
    close_pairs_between,
    hashes_to_words,
)
from radharmony_pipeline.processing.tables.table_schemas import PARENT_COLUMNS
from radharmony_pipeline.vocabulary import STATUS_OK

PARENT_IDENTITY: tuple[str, ...] = tuple(column.name for column in PARENT_COLUMNS)
# Conservative: re-encodes, resizes and brightness changes of one film stay within 7 bits of
# a 256-bit dHash, distinct radiographs are 34 or more apart (docs/design-notes.md).
PARENT_MATCH_RADIUS = 10
# Child splits used for evaluation.
EVALUATION_SPLITS = frozenset({"val", "test"})
MATCH_KINDS = ("identical_file", "identical_pixels", "near", "ambiguous", "unmatched")
EXAMPLES = 20


@dataclass(frozen=True)
class ParentDataset:
    """A dataset others are carved out of, and which of its official splits train or test."""

    key: str
    name: str
    train_splits: frozenset[str]
    test_splits: frozenset[str]
    # What the user provides so that its splits are known (None: always known).
    configure: str | None = None


PARENTS: dict[str, ParentDataset] = {
    parent.key: parent
    for parent in (
        ParentDataset("chexpert", "CheXpert", frozenset({"train"}), frozenset({"test"})),
        ParentDataset(
            "mimic_cxr",
            "MIMIC-CXR",
            frozenset({"train"}),
            frozenset({"test"}),
            "put mimic-cxr-2.0.0-split.csv.gz (from MIMIC-CXR-JPG) at the MIMIC-CXR root",
        ),
        ParentDataset(
            "nih_chestxray14",
            "NIH ChestX-ray14",
            frozenset({"train_val"}),
            frozenset({"test"}),
            "set RADHARMONY_NIH_ROOT (or put the download in <data root>/nih-chestxray14) and "
            "materialize nih_fingerprints",
        ),
        ParentDataset("rexgradient", "ReXGradient-160K", frozenset({"train"}), frozenset({"test"})),
    )
}


def parent_identity(
    rows: int,
    parent: str | None,
    image_ids: object = None,
    patient_ids: object = None,
    study_ids: object = None,
    splits: object = None,
    patient_splits: list | None = None,
) -> pd.DataFrame:
    """The parent columns for `rows` images (scalars or per-row values; None is null)."""
    frame = pd.DataFrame(index=range(rows))
    for name, values in zip(
        PARENT_IDENTITY[:5], (parent, image_ids, patient_ids, study_ids, splits), strict=True
    ):
        column = pd.Series(pd.NA, index=frame.index, dtype="string")
        if values is not None:
            column = pd.Series(
                np.asarray(values, dtype=object) if not isinstance(values, str) else values,
                index=frame.index,
            ).astype("string")
        frame[name] = column
    frame["parent_patient_splits"] = patient_splits if patient_splits is not None else None
    return frame


def splits_by_patient(patients: pd.Series, splits: pd.Series) -> dict[str, list[str]]:
    """Every patient's sorted official splits."""
    known = pd.DataFrame({"patient": patients, "split": splits}).dropna()
    grouped = known.drop_duplicates().groupby("patient")["split"]
    return {str(patient): sorted(map(str, values)) for patient, values in grouped}


def patient_splits_of(patients: pd.Series, by_patient: Mapping[str, list[str]]) -> list:
    """Per row, the patient's official splits (None when the patient is unknown)."""
    return [None if pd.isna(patient) else by_patient.get(str(patient)) for patient in patients]


# --- matching by content ----------------------------------------------------------------------


def match_to_parents(
    children: pd.DataFrame, parents: pd.DataFrame, radius: int = PARENT_MATCH_RADIUS
) -> pd.DataFrame:
    """Each child image's parent image: the same file, else the same resized pixels, else the
    one parent within `radius` bits of perceptual hash.

    `children` has `image_id, source_sha256, pixels_sha256, perceptual_hash`; `parents` has
    `parent_image_id` and the same three fingerprints. A child with several parents at its
    best tier is `ambiguous` (its `candidates` name them); no parent: `unmatched`.
    `shared_parent` marks children matched to a parent another child also matched.
    """
    children = children.reset_index(drop=True)
    n = len(children)
    kind = np.full(n, "unmatched", dtype=object)
    parent = np.full(n, None, dtype=object)
    distance = np.full(n, -1, dtype=np.int64)
    candidates: list[list[str]] = [[] for _ in range(n)]
    for tier, column in (
        ("identical_file", "source_sha256"),
        ("identical_pixels", "pixels_sha256"),
    ):
        owners = _parents_by_value(parents, column, children[column])
        for position, value in enumerate(children[column]):
            if kind[position] != "unmatched" or pd.isna(value) or value not in owners:
                continue
            found = owners[value]
            kind[position] = tier if len(found) == 1 else "ambiguous"
            parent[position] = found[0] if len(found) == 1 else None
            distance[position] = 0
            candidates[position] = found
    remaining = np.flatnonzero((kind == "unmatched") & children["perceptual_hash"].notna())
    hashed = parents.dropna(subset=["perceptual_hash"]).reset_index(drop=True)
    if len(remaining) and len(hashed):
        child_words = hashes_to_words(children["perceptual_hash"].iloc[remaining].tolist())
        parent_words = hashes_to_words(hashed["perceptual_hash"].tolist())
        found_pairs = close_pairs_between(child_words, parent_words, radius)
        child, other, bits = found_pairs.left, found_pairs.right, found_pairs.bits
        ids = hashed["parent_image_id"].to_numpy(dtype=object)
        order = np.lexsort((bits, child))
        for local, start, stop in _runs(child[order]):
            position = remaining[local]
            chosen = order[start:stop]
            found = sorted(set(ids[other[chosen]].tolist()))
            kind[position] = "near" if len(found) == 1 else "ambiguous"
            parent[position] = found[0] if len(found) == 1 else None
            distance[position] = int(bits[chosen].min())
            candidates[position] = found
    links = pd.DataFrame(
        {
            "image_id": children["image_id"].astype("string"),
            "parent_image_id": pd.Series(parent, dtype="string"),
            "match": pd.Series(kind, dtype="string"),
            "distance": pd.array(np.where(distance >= 0, distance, None), dtype="Int64"),
            "candidates": pd.Series(candidates, dtype=object),
        }
    )
    claimed = links["parent_image_id"].dropna()
    links["shared_parent"] = (
        links["parent_image_id"]
        .isin(claimed[claimed.duplicated(keep=False)])
        .fillna(False)
        .astype(bool)
    )
    return links


def _parents_by_value(parents: pd.DataFrame, column: str, wanted: pd.Series) -> dict:
    """The parents holding each of the `wanted` values of `column` (only those are grouped:
    the parent table is a hundred thousand rows, the children a few thousand)."""
    hits = parents.loc[parents[column].isin(wanted.dropna()).to_numpy(dtype=bool)]
    owners: dict[str, list[str]] = {}
    for value, parent in zip(hits[column].tolist(), hits["parent_image_id"].tolist(), strict=True):
        owners.setdefault(str(value), []).append(str(parent))
    return {value: sorted(found) for value, found in owners.items()}


def _runs(values: np.ndarray) -> Iterable[tuple[int, int, int]]:
    """(value, start, stop) of each run of equal values in a sorted array."""
    if len(values) == 0:
        return
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    stops = np.r_[starts[1:], len(values)]
    for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
        yield int(values[start]), start, stop


def match_counts(links: pd.DataFrame) -> dict[str, int]:
    """Children per match kind, and those sharing their parent with another child."""
    counts = {kind: int((links["match"] == kind).sum()) for kind in MATCH_KINDS}
    counts["matched"] = counts["identical_file"] + counts["identical_pixels"] + counts["near"]
    counts["sharing_a_parent"] = int(links["shared_parent"].sum())
    return counts


# --- leaks against the parents' splits -------------------------------------------------------


@dataclass(frozen=True)
class ParentLeaks:
    """What one check found: images per (child split, parent split) pair, examples, and per
    dataset whether it could be checked."""

    images: list[str]
    per_pair: dict[str, int]
    coverage: dict[str, str]
    examples: list[str] = field(default_factory=list)

    @property
    def unconfigured(self) -> dict[str, str]:
        return {k: v for k, v in self.coverage.items() if v.startswith("parent not configured")}


def eval_images_in_parent_train(provenance: pd.DataFrame) -> ParentLeaks:
    """Evaluation images (child val/test) whose own parent split is a training split."""
    in_train = _parent_split_in(provenance, "train_splits")
    return _leaks(provenance, _evaluation(provenance) & in_train, "parent_split")


def eval_patients_in_parent_train(provenance: pd.DataFrame) -> ParentLeaks:
    """Evaluation images whose parent patient has images in the parent's training split."""
    trained = _patient_in(provenance, "train_splits")
    return _leaks(provenance, _evaluation(provenance) & trained, "parent_patient_splits")


def train_images_in_parent_test(provenance: pd.DataFrame) -> ParentLeaks:
    """Child training images whose parent split is the parent's test split."""
    in_test = _parent_split_in(provenance, "test_splits")
    return _leaks(provenance, (provenance["split"] == "train").to_numpy() & in_test, "parent_split")


def patients_across_own_splits(provenance: pd.DataFrame, dataset: str) -> ParentLeaks:
    """Images of `dataset` whose parent patient also has images in another of its splits;
    pairs count patients (`train ~ test`)."""
    own = provenance[provenance["dataset"] == dataset]
    known = own.dropna(subset=["parent_patient_id"])
    if own.empty:
        coverage = {dataset: "no images"}
    elif known.empty:
        coverage = {dataset: _unconfigured_or_unknown(own, "parent patients")}
    else:
        coverage = {dataset: "checked"}
    splits = known.groupby("parent_patient_id")["split"].agg(lambda s: tuple(sorted(set(s))))
    shared = splits[splits.map(len) > 1]
    per_pair: dict[str, int] = {}
    for combination in shared:
        for i, left in enumerate(combination):
            for right in combination[i + 1 :]:
                pair = f"{dataset}.{left} ~ {dataset}.{right}"
                per_pair[pair] = per_pair.get(pair, 0) + 1
    images = sorted(known.loc[known["parent_patient_id"].isin(shared.index), "image_id"])
    members = known.groupby("parent_patient_id")["image_id"].agg(lambda s: ", ".join(sorted(s)))
    examples = [f"patient {patient}: {members[patient]}" for patient in sorted(shared.index)]
    examples = examples[:EXAMPLES]
    return ParentLeaks(list(map(str, images)), dict(sorted(per_pair.items())), coverage, examples)


def _evaluation(provenance: pd.DataFrame) -> np.ndarray:
    return provenance["split"].isin(EVALUATION_SPLITS).to_numpy(dtype=bool)


def _split_names(provenance: pd.DataFrame, which: str) -> list[frozenset[str]]:
    return [
        getattr(PARENTS[parent], which)
        if isinstance(parent, str) and parent in PARENTS
        else frozenset()
        for parent in provenance["parent_dataset"]
        .astype(object)
        .where(provenance["parent_dataset"].notna(), None)
    ]


def _parent_split_in(provenance: pd.DataFrame, which: str) -> np.ndarray:
    names = _split_names(provenance, which)
    return np.array(
        [
            isinstance(split, str) and split in allowed
            for split, allowed in zip(provenance["parent_split"].astype(object), names, strict=True)
        ],
        dtype=bool,
    )


def _patient_in(provenance: pd.DataFrame, which: str) -> np.ndarray:
    names = _split_names(provenance, which)
    return np.array(
        [
            _is_list(splits) and bool(set(splits) & allowed)
            for splits, allowed in zip(provenance["parent_patient_splits"], names, strict=True)
        ],
        dtype=bool,
    )


def _is_list(value: object) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _leaks(provenance: pd.DataFrame, found: np.ndarray, needs: str) -> ParentLeaks:
    hits = provenance.loc[found]
    per_pair: dict[str, int] = {}
    examples = []
    for row in hits.sort_values("image_id").itertuples(index=False):
        parent_split = row.parent_split if isinstance(row.parent_split, str) else "?"
        if needs == "parent_patient_splits":
            parent_split = "+".join(row.parent_patient_splits)
        pair = f"{row.dataset}.{row.split} ~ {row.parent_dataset}.{parent_split}"
        per_pair[pair] = per_pair.get(pair, 0) + 1
        if len(examples) < EXAMPLES:
            examples.append(
                f"{row.image_id} = {row.parent_dataset} {row.parent_image_id} "
                f"(patient {row.parent_patient_id}, {parent_split})"
            )
    coverage = {}
    for dataset, rows in provenance.groupby("dataset", sort=True):
        known = (
            rows[needs].map(_is_list) if needs == "parent_patient_splits" else rows[needs].notna()
        )
        coverage[str(dataset)] = (
            "checked" if known.any() else _unconfigured_or_unknown(rows, needs.replace("_", " "))
        )
    return ParentLeaks(
        sorted(map(str, hits["image_id"])), dict(sorted(per_pair.items())), coverage, examples
    )


def _unconfigured_or_unknown(rows: pd.DataFrame, what: str) -> str:
    parents = rows["parent_dataset"].dropna().unique().tolist()
    parent = PARENTS.get(str(parents[0])) if parents else None
    if parent is not None and parent.configure is not None:
        return f"parent not configured: no {parent.name} {what} ({parent.configure})"
    name = parent.name if parent is not None else "the parent"
    return f"not available: {name} {what} are not in the files read"


# --- tables ----------------------------------------------------------------------------------


def parent_links(
    children: pd.DataFrame, fingerprints: pd.DataFrame, entries: pd.DataFrame
) -> pd.DataFrame:
    """Each child image's match among the parent's fingerprints, with the patient and
    official split of the image found (`entries`: `image_index, patient_id, split`)."""
    usable = fingerprints[fingerprints["status"] == STATUS_OK]
    links = match_to_parents(children, usable)
    links.insert(1, "split", children["split"].astype("string").to_numpy())
    by_image = entries.set_index("image_index")
    links["parent_patient_id"] = (
        links["parent_image_id"].map(by_image["patient_id"]).astype("string")
    )
    links["parent_split"] = links["parent_image_id"].map(by_image["split"]).astype("string")
    by_patient = splits_by_patient(entries["patient_id"], entries["split"])
    links["parent_patient_splits"] = pd.Series(
        patient_splits_of(links["parent_patient_id"], by_patient), index=links.index, dtype=object
    )
    return links


def with_links(provenance: pd.DataFrame, links: pd.DataFrame) -> pd.DataFrame:
    """Provenance rows with the parent identity of linked images filled from `links`."""
    if links.empty:
        return provenance
    found = links.dropna(subset=["parent_image_id"]).set_index("image_id")
    linked = provenance["image_id"].isin(found.index).to_numpy()
    ids = provenance.loc[linked, "image_id"]
    provenance = provenance.copy()
    for column in ("parent_image_id", "parent_patient_id", "parent_split"):
        provenance.loc[linked, column] = ids.map(found[column]).to_numpy()
    splits = provenance["parent_patient_splits"].astype(object).tolist()
    patient_splits = found["parent_patient_splits"]
    for position, image_id in zip(np.flatnonzero(linked).tolist(), ids, strict=True):
        splits[position] = patient_splits[image_id]
    provenance["parent_patient_splits"] = splits
    return provenance


def with_parent_columns(manifest: pd.DataFrame, provenance: pd.DataFrame) -> pd.DataFrame:
    """The manifest with each image's parent identity from `provenance` (null if absent)."""
    identity = provenance.drop_duplicates("image_id").set_index("image_id")[list(PARENT_IDENTITY)]
    return manifest.drop(columns=list(PARENT_IDENTITY), errors="ignore").join(
        identity, on="image_id"
    )


# --- acting on it (the loader's options) -----------------------------------------------------


def without_parent_train_leaks(manifest: pd.DataFrame) -> pd.DataFrame:
    """Rows except evaluation images in their parent's training split."""
    leaking = _evaluation(manifest) & _parent_split_in(manifest, "train_splits")
    return manifest[~leaking]


def without_parent_patient_leaks(manifest: pd.DataFrame) -> pd.DataFrame:
    """Rows except evaluation images whose parent patient has images in the parent's
    training split."""
    leaking = _evaluation(manifest) & _patient_in(manifest, "train_splits")
    return manifest[~leaking]


def patient_disjoint_by_parent(manifest: pd.DataFrame) -> pd.DataFrame:
    """Rows except non-train images of a dataset whose parent patient also has a train image
    in that dataset (the train side is kept); rows without a parent patient are kept."""
    patients = manifest["dataset"].astype(str) + "\0" + manifest["parent_patient_id"].astype(str)
    known = manifest["parent_patient_id"].notna().to_numpy(dtype=bool)
    train = (manifest["split"] == "train").to_numpy(dtype=bool)
    trained = set(patients[known & train])
    shared = known & ~train & patients.isin(trained).to_numpy(dtype=bool)
    return manifest[~shared]
