"""`near_duplicates`: groups of images with (nearly) the same content across the whole corpus,
and a contact sheet of example groups that join splits or datasets."""

from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
from PIL import Image

from ...processing.corpus.duplicates import PackedContents, near_duplicate_members
from ...processing.corpus.previews import PreviewSample, contact_sheet, save_png
from ...processing.imaging.perceptual_hash import DEFAULT_RADIUS, HASH_BITS
from ...processing.storage.output_layout import NEAR_DUPLICATE_SHEET
from ...processing.storage.store import open_for_reading
from ...processing.tables.table_schemas import NEAR_DUPLICATES
from ...sources import parse_partition_key
from ...vocabulary import STATUS_OK
from ..groups import CORPUS
from ..partitions import every_partition_of
from ..previews import inline_sheet
from ..resources import OutputsResource
from ..stages import corpus_table

CODE_VERSION = "2"
SHEET_GROUPS = 6
SHEET_MEMBERS = 4
_KIND_LABELS = {"identical_file": "same file", "identical_pixels": "same pixels", "near": "near"}


@corpus_table(
    NEAR_DUPLICATES,
    CORPUS,
    CODE_VERSION,
    description=(
        f"Images whose {HASH_BITS}-bit perceptual hashes (dHash of the resized content) lie "
        f"within {DEFAULT_RADIUS} bits of each other, as connected components over every "
        "materialized partition: one row per member with its group, the datasets and splits "
        "the group spans, its distance to the group's representative and a kind "
        "(identical_file, identical_pixels, near). Hash pairs are found exactly by multi-index "
        "hashing, not by comparing every pair, and each is kept only when the resized pixels "
        "show the same film (different radiographs look alike)."
    ),
    ins=every_partition_of("images"),
)
def near_duplicates(
    context: dg.AssetExecutionContext,
    images: dict[str, pd.DataFrame],
    outputs: OutputsResource,
) -> dg.Output[pd.DataFrame]:
    corpus = corpus_images(images)
    search = near_duplicate_members(corpus, PackedContents(outputs.root()))
    members = search.members
    context.log.info(
        f"{len(members)} images in {members['group_id'].nunique()} groups; "
        f"{search.hashes_compared:,} hash pairs compared, {search.candidates:,} within "
        f"{DEFAULT_RADIUS} bits, {search.confirmed:,} confirmed and {search.rejected:,} "
        "rejected on their pixels"
    )
    metadata = {
        "images_compared": len(corpus),
        "hash_pairs_compared": search.hashes_compared,
        "hash_candidates": search.candidates,
        "candidates_confirmed": search.confirmed,
        "candidates_rejected": search.rejected,
        "partitions": dg.MetadataValue.json(sorted(images)),
        "groups": int(members["group_id"].nunique()),
        "images_in_groups": len(members),
        "kinds": dg.MetadataValue.json(members["kind"].value_counts().to_dict()),
        "radius_bits": DEFAULT_RADIUS,
    }
    metadata.update(example_sheet(members, outputs.root()))
    return dg.Output(members, metadata=metadata)


def corpus_images(images: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Usable images of every partition with their dataset and split."""
    frames = []
    for partition, table in sorted(images.items()):
        dataset, split = parse_partition_key(partition)
        ok = table[table["status"] == STATUS_OK].copy()
        if "perceptual_hash" not in ok:
            raise dg.Failure(
                description=f"images of {partition} have no perceptual_hash column; "
                "rematerialize `images` for that partition"
            )
        unhashed = ok["perceptual_hash"].isna()
        if unhashed.any():
            raise dg.Failure(
                description=f"{int(unhashed.sum())} images of {partition} have no perceptual "
                f"hash (e.g. {ok.loc[unhashed, 'image_id'].iloc[0]}); rematerialize `images` "
                "for that partition"
            )
        ok["dataset"], ok["split"] = dataset, split
        frames.append(ok)
    if not frames:
        raise dg.Failure(description="no partition of `images` is materialized yet")
    return pd.concat(frames, ignore_index=True)


def example_sheet(members: pd.DataFrame, root: Path) -> dict:
    """Up to six groups side by side (those spanning the most partitions first)."""
    if members.empty:
        return {}
    spans = members.drop_duplicates("group_id").assign(width=lambda f: f["group_splits"].map(len))
    chosen = spans.sort_values(["width", "group_id"], ascending=[False, True])["group_id"]
    samples = []
    for group_id in chosen.head(SHEET_GROUPS):
        group = members[members["group_id"] == group_id].head(SHEET_MEMBERS)
        for row in group.itertuples(index=False):
            with open_for_reading(root / row.image_path) as handle, Image.open(handle) as image:
                pixels = np.asarray(image.convert("L"))
            title = (
                f"{row.dataset}.{row.split} {_KIND_LABELS[row.kind]} "
                f"d={row.distance_to_representative}"
            )
            samples.append(PreviewSample(title=title, image=pixels))
        samples += [PreviewSample(title="", image=np.zeros((8, 8), np.uint8))] * (
            SHEET_MEMBERS - len(group)
        )
    sheet = contact_sheet(samples, columns=SHEET_MEMBERS, tile=224)
    save_png(sheet, root / NEAR_DUPLICATE_SHEET)
    return {
        "examples": dg.MetadataValue.path(str(root / NEAR_DUPLICATE_SHEET)),
        "examples_inline": dg.MetadataValue.md(inline_sheet(sheet)),
    }
