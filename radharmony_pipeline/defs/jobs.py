"""Jobs: observe the downloads, and one job per stage group for the UI's launchpad."""

import dagster as dg

from .assets.source_files import source_files

OBSERVE_JOB = "observe_source_files"

observe_source_files_job = dg.define_asset_job(
    OBSERVE_JOB,
    selection=dg.AssetSelection.assets(source_files.key),
    description="Fingerprint every partition's downloaded files (annotations + image tree).",
)

index_and_labels_job = dg.define_asset_job(
    "index_and_labels",
    selection=dg.AssetSelection.groups("index", "labels"),
    description="Read the native metadata of a partition into raw_index and labels.",
)
