"""A visual profile of a partition or of the whole corpus: one PNG of matplotlib panels
(label prevalence per dataset, labels read from reports per dataset, view positions, source
sizes, report length, mask area per class, box size and position, class co-occurrence), drawn
with the Agg backend."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from matplotlib.axes import Axes

from radharmony_pipeline.processing.annotations.boxes import NORMALIZED_COLUMNS
from radharmony_pipeline.processing.reports.report_table import (
    PREVALENCE_STATES,
    report_label_prevalence,
)
from radharmony_pipeline.vocabulary import LABEL_COLUMNS, STATUS_OK, UNION_CLASS

COLUMNS = 4
PANEL_INCHES = (4.6, 3.6)
STATES = ("positive", "negative", "not annotated")
STATE_COLOURS = ("#d62728", "#2ca02c", "#c7c7c7")
# Report labels: positive, uncertain, negative (PREVALENCE_STATES order), then not mentioned.
REPORT_STATE_COLOURS = ("#d62728", "#ff7f0e", "#2ca02c", "#c7c7c7")


@dataclass(frozen=True)
class CorpusTables:
    """The stage tables a profile is drawn from (one partition or all of them concatenated)."""

    raw_index: pd.DataFrame
    labels: pd.DataFrame
    masks: pd.DataFrame
    bboxes: pd.DataFrame
    images: pd.DataFrame
    report_labels: pd.DataFrame


def label_prevalence(tables: CorpusTables) -> pd.DataFrame:
    """Images per (dataset, class) that are positive, negative and not annotated."""
    labels = tables.labels  # every partitioned table carries its dataset
    rows = []
    for dataset, group in labels.groupby("dataset", sort=True):
        for column in LABEL_COLUMNS:
            values = group[column]
            rows.append(
                {
                    "dataset": str(dataset),
                    "label": column.removeprefix("label_"),
                    "positive": int((values == 1).sum()),
                    "negative": int((values == 0).sum()),
                    "not_annotated": int(values.isna().sum()),
                }
            )
    return pd.DataFrame(
        rows, columns=["dataset", "label", "positive", "negative", "not_annotated"]
    ).astype({"dataset": "string", "label": "string"})


def profile_pngs(tables: CorpusTables, title: str, dpis: tuple[int, ...]) -> list[bytes]:
    """The profile as PNG bytes at each resolution in `dpis`: a grid of panels, `COLUMNS`
    wide (drawn once, saved once per resolution)."""
    prevalence = label_prevalence(tables)
    datasets = list(dict.fromkeys(prevalence["dataset"]))
    cooccurring = _fully_annotated(tables)
    panels = [
        *[(f"labels: {d}", lambda ax, d=d: _prevalence(ax, prevalence, d)) for d in datasets],
        *[
            (f"labels read from reports: {d}", lambda ax, g=g: _report_prevalence(ax, g))
            for d, g in tables.report_labels.groupby("dataset", sort=True)
            if len(g)
        ],
        ("view positions", lambda ax: _views(ax, tables.raw_index)),
        ("source image sizes", lambda ax: _sizes(ax, tables.images)),
        ("report length", lambda ax: _report_length(ax, tables.labels)),
        ("mask area fraction per class", lambda ax: _mask_area(ax, tables.masks)),
        ("box size", lambda ax: _box_size(ax, tables.bboxes)),
        ("box position heat map", lambda ax: _box_heat_map(ax, tables.bboxes)),
        *[
            (f"class co-occurrence: {d}", lambda ax, d=d, c=c: _cooccurrence(ax, c))
            for d, c in cooccurring.items()
        ],
    ]
    rows = math.ceil(len(panels) / COLUMNS)
    plt = _pyplot()
    figure, axes = plt.subplots(
        rows,
        COLUMNS,
        figsize=(PANEL_INCHES[0] * COLUMNS, PANEL_INCHES[1] * rows),
        squeeze=False,
    )
    try:
        for ax, (name, draw) in zip(axes.ravel(), panels, strict=False):
            ax.set_title(name, fontsize=10)
            draw(ax)
        for ax in axes.ravel()[len(panels) :]:
            ax.axis("off")
        figure.suptitle(title, fontsize=13)
        figure.tight_layout()
        pictures = []
        for dpi in dpis:
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=dpi)
            pictures.append(buffer.getvalue())
    finally:
        plt.close(figure)
    return pictures


def _pyplot():
    # Imported on first use: matplotlib takes about 0.5 s to import, which every process that
    # loads the definitions (CLI, step workers) paid, not only the profile step.
    import matplotlib

    matplotlib.use("Agg")  # no display, ever
    import matplotlib.pyplot as plt

    return plt


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, color="#777777")
    ax.set_xticks([])
    ax.set_yticks([])


def _prevalence(ax: Axes, prevalence: pd.DataFrame, dataset: str) -> None:
    rows = prevalence[prevalence["dataset"] == dataset]
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    for state, column, colour in zip(
        STATES, ("positive", "negative", "not_annotated"), STATE_COLOURS, strict=True
    ):
        values = rows[column].to_numpy(dtype=float)
        ax.barh(y, values, left=left, color=colour, label=state, height=0.8)
        left += values
    ax.set_yticks(y, rows["label"], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("images", fontsize=8)
    ax.legend(fontsize=6, loc="lower right")


def _report_prevalence(ax: Axes, report_labels: pd.DataFrame) -> None:
    """Per observation, the images whose report states it positive, uncertain or negative,
    and those whose report does not mention it."""
    counts = pd.DataFrame(report_label_prevalence(report_labels)).T
    states = [*PREVALENCE_STATES, "not_mentioned"]
    y = np.arange(len(counts))
    left = np.zeros(len(counts))
    for state, colour in zip(states, REPORT_STATE_COLOURS, strict=True):
        values = counts[state].to_numpy(dtype=float)
        ax.barh(y, values, left=left, color=colour, label=state.replace("_", " "), height=0.8)
        left += values
    ax.set_yticks(y, counts.index, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("images", fontsize=8)
    ax.legend(fontsize=6, loc="lower right")


def _views(ax: Axes, raw_index: pd.DataFrame) -> None:
    counts = raw_index.groupby(["view_position", "dataset"]).size().unstack(fill_value=0)
    if counts.empty:
        return _empty(ax, "no images")
    counts.plot.bar(ax=ax, stacked=True, fontsize=7, rot=0)
    ax.set_xlabel("")
    ax.legend(fontsize=6)


def _sizes(ax: Axes, images: pd.DataFrame) -> None:
    ok = images.dropna(subset=["orig_height", "orig_width"])
    if ok.empty:
        return _empty(ax, "no decoded images")
    ax.scatter(ok["orig_width"], ok["orig_height"], s=6, alpha=0.5)
    ax.set_xlabel("width (px)", fontsize=8)
    ax.set_ylabel("height (px)", fontsize=8)


def _report_length(ax: Axes, labels: pd.DataFrame) -> None:
    words = words_per_report(labels["report"]) if "report" in labels else np.array([])
    if words.size == 0:
        return _empty(ax, "no reports")
    ax.hist(words, bins=30, color="#1f77b4")
    ax.set_xlabel("words per report", fontsize=8)
    ax.set_ylabel("images", fontsize=8)


def words_per_report(reports: pd.Series) -> np.ndarray:
    """How many words each report that is there (not null) has, as str.split() counts them
    (runs of Unicode whitespace between words), computed in Arrow: str.split per report took
    seconds at ReXGradient's 273,004 images."""
    texts = pc.drop_null(pa.array(reports, type=pa.string(), from_pandas=True))
    trimmed = pc.utf8_trim_whitespace(texts)
    pieces = pc.list_value_length(pc.utf8_split_whitespace(trimmed))
    # An empty report splits into one empty piece: no word.
    words = pc.if_else(pc.equal(pc.utf8_length(trimmed), 0), 0, pieces)
    return words.to_numpy(zero_copy_only=False)


def _mask_area(ax: Axes, masks: pd.DataFrame) -> None:
    ok = masks[(masks["status"] == STATUS_OK) & (masks["mask_class"] != UNION_CLASS)]
    if ok.empty:
        return _empty(ax, "no masks")
    by_class = {str(c): g["area_fraction"].to_numpy() for c, g in ok.groupby("mask_class")}
    ax.boxplot(list(by_class.values()), orientation="horizontal", showfliers=False)
    ax.set_yticks(range(1, len(by_class) + 1), list(by_class), fontsize=6)
    ax.set_xlabel("fraction of the image", fontsize=8)


def _box_size(ax: Axes, bboxes: pd.DataFrame) -> None:
    ok = bboxes[bboxes["status"] == STATUS_OK]
    if ok.empty:
        return _empty(ax, "no boxes")
    ax.scatter(ok["x_max"] - ok["x_min"], ok["y_max"] - ok["y_min"], s=6, alpha=0.5)
    ax.set_xlabel("width (fraction)", fontsize=8)
    ax.set_ylabel("height (fraction)", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)


def _box_heat_map(ax: Axes, bboxes: pd.DataFrame, cells: int = 32) -> None:
    """How often each cell of the (normalized) image is covered by a box."""
    ok = bboxes[bboxes["status"] == STATUS_OK]
    if ok.empty:
        return _empty(ax, "no boxes")
    coverage = np.zeros((cells, cells))
    for y0, y1, x0, x1 in ok[list(NORMALIZED_COLUMNS)].to_numpy(dtype=float):
        rows = slice(int(y0 * cells), max(math.ceil(y1 * cells), int(y0 * cells) + 1))
        columns = slice(int(x0 * cells), max(math.ceil(x1 * cells), int(x0 * cells) + 1))
        coverage[rows, columns] += 1
    image = ax.imshow(coverage, extent=(0, 1, 1, 0), cmap="magma")
    ax.figure.colorbar(image, ax=ax, fraction=0.046)


def _fully_annotated(tables: CorpusTables) -> dict[str, pd.DataFrame]:
    """Per dataset whose classes are 0/1 on every image: its positive-label matrix."""
    labels = tables.labels  # every partitioned table carries its dataset
    matrices = {}
    for dataset, group in labels.groupby("dataset", sort=True):
        annotated = [c for c in LABEL_COLUMNS if group[c].notna().any()]
        complete = [c for c in annotated if group[c].notna().all() and c != "label_no_finding"]
        if len(complete) >= 2 and len(complete) == len(annotated):
            matrices[str(dataset)] = group[complete].eq(1).astype(int)
    return matrices


def _cooccurrence(ax: Axes, positives: pd.DataFrame) -> None:
    counts = positives.T.dot(positives).to_numpy()
    names = [c.removeprefix("label_") for c in positives.columns]
    image = ax.imshow(counts, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.figure.colorbar(image, ax=ax, fraction=0.046)
