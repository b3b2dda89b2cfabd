"""Provenance to the parent datasets: NIH ChestX-ray14 fingerprinted, ChestX-Det matched back
to it by content, and every image's parent identity in one table (checked in checks/parents)."""

from typing import Literal

import dagster as dg
import pandas as pd
from pydantic import Field

from ...processing.corpus.parent_fingerprints import (
    fingerprint_parent_images,
    fingerprint_table,
    parent_image_jobs,
)
from ...processing.corpus.parents import (
    PARENT_IDENTITY,
    PARENT_MATCH_RADIUS,
    match_counts,
    parent_links,
    with_links,
)
from ...processing.execution.progress import ProgressLog
from ...processing.storage.output_layout import table_file
from ...processing.storage.source_store import annotation_fingerprint
from ...processing.tables.table_schemas import NIH_FINGERPRINTS, NIH_PARENT_LINKS, PARENT_PROVENANCE
from ...settings import MAX_IMAGE_SIZE, image_size
from ...sources import SOURCE_TYPES, SourceError
from ...sources.nih_chestxray14 import KEY as NIH_KEY
from ...sources.nih_chestxray14 import LAYOUT
from ...vocabulary import STATUS_ERROR, STATUS_OK
from ..groups import PARENTS
from ..io_managers import read_table_file
from ..metadata import definition_metadata, status_counts, table_code_version
from ..partitions import OWNERS, every_partition_of
from ..resources import DatasetsResource, OutputsResource
from ..run_settings import RunSettingsResource, from_environment
from ..stages import corpus_table

CODE_VERSION = "1"
NOT_CONFIGURED = "parent not configured"
# The partitions of the datasets carved out of NIH ChestX-ray14 (ChestX-Det): their images are
# matched to NIH's by content.
NIH_CHILD_PARTITIONS = tuple(
    f"{key}.{split}"
    for key, source in SOURCE_TYPES.items()
    if source.parent_dataset == NIH_KEY
    for split in source.splits
)


class NihFingerprintsConfig(dg.Config):
    size: int = Field(
        default_factory=from_environment(image_size),
        ge=1,
        le=MAX_IMAGE_SIZE,
        description="Side S, as `images` was built with (default RADHARMONY_IMAGE_SIZE or 224): "
        "the resized-pixel fingerprints only compare at one size.",
    )
    resize: Literal["letterbox", "squash"] = Field(
        default="letterbox", description="As `images` was built with."
    )


@dg.asset(
    group_name=PARENTS,
    owners=OWNERS,
    description=(
        "Every NIH ChestX-ray14 image fingerprinted as `images` fingerprints its own (source "
        "SHA-256, resized-pixel SHA-256, 256-bit dHash), so ChestX-Det images can be found in "
        "it. Incremental: an image whose file and settings are unchanged keeps its row. Empty, "
        f"with `{NOT_CONFIGURED}`, without an NIH download (RADHARMONY_NIH_ROOT)."
    ),
    code_version=table_code_version(CODE_VERSION),
    metadata=definition_metadata(NIH_FINGERPRINTS),
    kinds={"parquet", "pandas"},
)
def nih_fingerprints(
    context: dg.AssetExecutionContext,
    config: NihFingerprintsConfig,
    datasets: DatasetsResource,
    outputs: OutputsResource,
    run_settings: RunSettingsResource,
) -> dg.Output[pd.DataFrame]:
    nih = datasets.nih()
    if nih is None:
        return dg.Output(fingerprint_table([]), metadata={"parent": NOT_CONFIGURED})
    try:
        listed = set(nih.read_entries()["image_index"])
    except SourceError as exc:
        raise dg.Failure(description=str(exc)) from exc
    jobs = parent_image_jobs(nih.root, nih.image_states(), config.size, config.resize)
    if not jobs:
        raise dg.Failure(
            description=f"no PNG under {nih.root}/images/ or {nih.root}/images_NNN/images/; "
            f"unpack the NIH image archives there (expected layout:\n{LAYOUT})"
        )
    progress = ProgressLog(context.log, "NIH images to fingerprint", len(jobs))
    # The local processes run as many images at once as the executor runs chunks.
    slots = run_settings.executor().slots()
    table, decoded = fingerprint_parent_images(
        jobs, _previous_table(outputs, "nih_fingerprints"), slots, progress.update
    )
    errors = table[table["status"] == STATUS_ERROR]
    if len(errors) * 2 > len(table):
        raise dg.Failure(
            description=f"{len(errors)} of {len(table)} NIH images could not be fingerprinted, "
            f"e.g. {errors['error'].iloc[0]}"
        )
    on_disk = set(table["parent_image_id"])
    return dg.Output(
        table,
        metadata={
            "parent": str(nih.root),
            "images": len(table),
            "listed_in_data_entry": len(listed),
            "listed_but_not_on_disk": len(listed - on_disk),
            "on_disk_but_not_listed": len(on_disk - listed),
            "decoded": decoded,
            "reused": len(table) - decoded,
            "status": dg.MetadataValue.json(status_counts(table)),
            "size": config.size,
            "resize": config.resize,
        },
    )


def _previous_table(outputs: OutputsResource, name: str) -> pd.DataFrame | None:
    """The asset's last output (where the IO manager keeps it), for per-row re-use."""
    try:
        return read_table_file(table_file(outputs.root(), name))
    except (OSError, ValueError):
        return None


@corpus_table(
    NIH_PARENT_LINKS,
    PARENTS,
    CODE_VERSION,
    description=(
        "Every ChestX-Det image matched to its NIH ChestX-ray14 original by content: the same "
        "file, else the same resized pixels, else the one NIH image within "
        f"{PARENT_MATCH_RADIUS} bits of perceptual hash. Several candidates: `ambiguous`; none: "
        "`unmatched`; two ChestX-Det images on one NIH image: `shared_parent`. The NIH Image "
        "Index gives the patient and the official split."
    ),
    ins={
        "images": dg.AssetIn(
            "images",
            partition_mapping=dg.SpecificPartitionsPartitionMapping(list(NIH_CHILD_PARTITIONS)),
            metadata={"allow_missing_partitions": True},
        ),
        "nih_fingerprints": dg.AssetIn("nih_fingerprints"),
    },
)
def nih_parent_links(
    context: dg.AssetExecutionContext,
    images: dict[str, pd.DataFrame],
    nih_fingerprints: pd.DataFrame,
    datasets: DatasetsResource,
) -> dg.Output[pd.DataFrame]:
    nih = datasets.nih()
    children = _chestx_det_images(images)
    if nih is None or nih_fingerprints.empty:
        empty = parent_links(children.iloc[:0], nih_fingerprints.iloc[:0], _no_entries())
        return dg.Output(empty, metadata={"parent": NOT_CONFIGURED})
    _check_same_settings(children, nih_fingerprints)
    try:
        entries = nih.read_entries()
    except SourceError as exc:
        raise dg.Failure(description=str(exc)) from exc
    links = parent_links(children, nih_fingerprints, entries)
    counts = match_counts(links)
    context.log.info(f"ChestX-Det → NIH: {counts}")
    return dg.Output(
        links,
        metadata={
            "parent": str(nih.root),
            **counts,
            "radius_bits": PARENT_MATCH_RADIUS,
            "parent_files": dg.MetadataValue.json(_versions(nih.metadata_files())),
        },
    )


def _chestx_det_images(images: dict[str, pd.DataFrame]) -> pd.DataFrame:
    frames = []
    for partition in NIH_CHILD_PARTITIONS:
        if partition in images:
            table = images[partition]
            frames.append(table[table["status"] == STATUS_OK].assign(split=partition.split(".")[1]))
    columns = ["image_id", "split", "size", "resize", "source_sha256", "pixels_sha256"]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="string") for c in [*columns, "perceptual_hash"]})
    return pd.concat(frames, ignore_index=True)[[*columns, "perceptual_hash"]]


def _check_same_settings(children: pd.DataFrame, fingerprints: pd.DataFrame) -> None:
    """Resized-pixel fingerprints compare only between images resized alike."""
    child = set(zip(children["size"], children["resize"], strict=True))
    parent = set(zip(fingerprints["size"], fingerprints["resize"], strict=True))
    if child and child != parent:
        raise dg.Failure(
            description=f"ChestX-Det images were resized as {sorted(child)} but NIH "
            f"fingerprints as {sorted(parent)}; materialize nih_fingerprints with the size and "
            "resize `images` used"
        )


def _no_entries() -> pd.DataFrame:
    return pd.DataFrame(
        {column: pd.Series(dtype="string") for column in ("image_index", "patient_id", "split")}
    )


def _versions(paths: list) -> dict[str, str | None]:
    """Each parent file with its data version (content hash; size + ETag on a store)."""
    return {str(path): annotation_fingerprint(path) for path in paths}


@corpus_table(
    PARENT_PROVENANCE,
    PARENTS,
    CODE_VERSION,
    description=(
        "Every image's identity in its parent dataset (CheXpert, MIMIC-CXR, NIH ChestX-ray14, "
        "ReXGradient): parent image, patient, study, official split, and the splits the parent "
        "patient has images in. From the datasets' own ids, MIMIC-CXR's split file and, for "
        "ChestX-Det, `nih_parent_links`; null where unknown, never guessed."
    ),
    ins=every_partition_of("raw_index") | {"nih_parent_links": dg.AssetIn("nih_parent_links")},
)
def parent_provenance(
    context: dg.AssetExecutionContext,
    raw_index: dict[str, pd.DataFrame],
    nih_parent_links: pd.DataFrame,
    datasets: DatasetsResource,
) -> dg.Output[pd.DataFrame]:
    columns = ["image_id", "dataset", "split", *PARENT_IDENTITY]
    frames = [raw_index[key].reindex(columns=columns) for key in sorted(raw_index)]
    if not frames:
        raise dg.Failure(description="no partition of `raw_index` is materialized yet")
    provenance = with_links(pd.concat(frames, ignore_index=True), nih_parent_links)
    known = provenance.groupby("dataset")["parent_split"].agg(lambda s: int(s.notna().sum()))
    return dg.Output(
        provenance,
        metadata={
            "images": len(provenance),
            "with_parent_split": dg.MetadataValue.json({str(k): int(v) for k, v in known.items()}),
            "parent_files": dg.MetadataValue.json(parent_file_versions(datasets)),
        },
    )


def parent_file_versions(datasets: DatasetsResource) -> dict[str, str | None]:
    """The parent files of every dataset (and NIH's) with their data versions."""
    files = []
    for key in SOURCE_TYPES:
        files += datasets.source(key).parent_files()
    nih = datasets.nih()
    if nih is not None:
        files += nih.metadata_files()
    return _versions(files)
