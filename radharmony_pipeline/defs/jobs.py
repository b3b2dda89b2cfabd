"""Jobs: observe the downloads, and one job per stage group for the UI's launchpad."""

import dagster as dg

from .assets.card import corpus_card
from .assets.source_files import source_files
from .groups import CORPUS_JOINS, PARTITION_STAGES, PUBLISHING

OBSERVE_JOB = "observe_source_files"

observe_source_files_job = dg.define_asset_job(
    OBSERVE_JOB,
    selection=dg.AssetSelection.assets(source_files.key),
    description="Fingerprint every partition's downloaded files (annotations + image tree).",
)

ALL_STAGES_JOB = "all_stages"

# Every stage of one partition (groups.PARTITION_STAGES). Observing the downloads is its own
# job (a partition's run should not re-fingerprint all ten); the joins over every partition,
# the exports and the card run after the stages, in their own jobs.

all_stages_job = dg.define_asset_job(
    ALL_STAGES_JOB,
    selection=PARTITION_STAGES,
    description="Every stage of one `<dataset>.<split>` partition, with its checks.",
)

EXPORTS_JOB = "exports"

exports_job = dg.define_asset_job(
    EXPORTS_JOB,
    selection=dg.AssetSelection.groups(PUBLISHING) - dg.AssetSelection.assets(corpus_card),
    description="One partition's Hugging Face and WebDataset shards (docs/exports.md).",
)

MANIFEST_JOB = "manifest"

manifest_job = dg.define_asset_job(
    MANIFEST_JOB,
    selection=CORPUS_JOINS,
    description="Join every materialized partition into the unified manifest.",
)

index_and_labels_job = dg.define_asset_job(
    "index_and_labels",
    selection=dg.AssetSelection.assets("raw_index", "labels"),
    description="Read the native metadata of a partition into raw_index and labels.",
)

CARD_JOB = "dataset_card"

corpus_card_job = dg.define_asset_job(
    CARD_JOB,
    selection=dg.AssetSelection.assets(corpus_card),
    description="Write DATASET_CARD.md and croissant.json from the manifest and the checks.",
)
