"""The one Definitions object of the project (workspace.yaml and `dagster dev` load this)."""

import dagster as dg

from .defs.assets.bboxes import bboxes
from .defs.assets.images import images
from .defs.assets.index_and_labels import raw_index_and_labels
from .defs.assets.manifest import unified_manifest
from .defs.assets.masks import masks
from .defs.assets.source_files import source_files
from .defs.automation import nightly_observation, rebuild_sensor
from .defs.checks.counts import counts_match_documentation
from .defs.checks.dataset_figures import dataset_figures_match_documentation
from .defs.checks.expectations import labels_suite, raw_index_suite
from .defs.checks.manifest import (
    manifest_paths_exist,
    manifest_suite,
    manifest_totals_match_documentation,
    patients_disjoint_across_splits,
)
from .defs.checks.masks_and_boxes import (
    bboxes_match_documentation,
    bboxes_suite,
    masks_match_documentation,
    masks_suite,
    positives_without_masks,
)
from .defs.checks.row_errors import ROW_ERROR_CHECKS
from .defs.io_managers import ParquetIOManager
from .defs.jobs import (
    all_stages_job,
    index_and_labels_job,
    manifest_job,
    observe_source_files_job,
)
from .defs.resources import DatasetsResource, OutputsResource
from .processing.settings import validate_settings

# Settings are checked once, before anything runs: a bad value names its variable here
# instead of turning every row of every partition into an error.
validate_settings()

outputs = OutputsResource()

defs = dg.Definitions(
    assets=[source_files, raw_index_and_labels, masks, bboxes, images, unified_manifest],
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
        dataset_figures_match_documentation,
        manifest_paths_exist,
        manifest_suite,
        patients_disjoint_across_splits,
        *ROW_ERROR_CHECKS,
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
