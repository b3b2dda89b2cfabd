"""The one Definitions object of the project (workspace.yaml and `dagster dev` load this)."""

import dagster as dg

from .defs.assets.bboxes import bboxes
from .defs.assets.images import images
from .defs.assets.index_and_labels import raw_index_and_labels
from .defs.assets.manifest import unified_manifest
from .defs.assets.masks import masks
from .defs.assets.near_duplicates import near_duplicates
from .defs.assets.profile import corpus_profile, partition_profile
from .defs.assets.source_files import source_files
from .defs.automation import nightly_observation, rebuild_sensor
from .defs.checks.counts import counts_match_documentation
from .defs.checks.duplicates import (
    near_duplicates_across_splits,
    no_identical_images_across_train_and_test,
)
from .defs.checks.expectations import labels_suite, raw_index_suite
from .defs.checks.manifest import (
    manifest_paths_exist,
    manifest_suite,
    manifest_totals_match_documentation,
    no_patient_in_train_and_test,
)
from .defs.checks.masks_and_boxes import (
    bboxes_match_documentation,
    bboxes_suite,
    masks_match_documentation,
    masks_suite,
    positives_without_masks,
)
from .defs.io_managers import ParquetIOManager
from .defs.jobs import (
    all_stages_job,
    index_and_labels_job,
    manifest_job,
    observe_source_files_job,
)
from .defs.resources import DatasetsResource, OutputsResource

outputs = OutputsResource()

defs = dg.Definitions(
    assets=[
        source_files,
        raw_index_and_labels,
        masks,
        bboxes,
        images,
        unified_manifest,
        near_duplicates,
        partition_profile,
        corpus_profile,
    ],
    asset_checks=[
        counts_match_documentation,
        raw_index_suite,
        labels_suite,
        masks_match_documentation,
        masks_suite,
        positives_without_masks,
        bboxes_match_documentation,
        bboxes_suite,
        manifest_totals_match_documentation,
        manifest_paths_exist,
        manifest_suite,
        no_patient_in_train_and_test,
        no_identical_images_across_train_and_test,
        near_duplicates_across_splits,
    ],
    jobs=[observe_source_files_job, all_stages_job, index_and_labels_job, manifest_job],
    schedules=[nightly_observation],
    sensors=[rebuild_sensor],
    resources={
        "datasets": DatasetsResource(),
        "outputs": outputs,
        "io_manager": ParquetIOManager(outputs=outputs),
    },
)
