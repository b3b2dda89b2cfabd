"""The one Definitions object of the project (workspace.yaml and `dagster dev` load this)."""

import dagster as dg

from .defs.assets.index_and_labels import raw_index_and_labels
from .defs.assets.source_files import source_files
from .defs.checks.counts import counts_match_documentation
from .defs.checks.expectations import labels_suite, raw_index_suite
from .defs.io_managers import ParquetIOManager
from .defs.jobs import all_stages_job, index_and_labels_job, observe_source_files_job
from .defs.resources import DatasetsResource

defs = dg.Definitions(
    assets=[source_files, raw_index_and_labels],
    asset_checks=[counts_match_documentation, raw_index_suite, labels_suite],
    jobs=[observe_source_files_job, all_stages_job, index_and_labels_job],
    resources={
        "datasets": DatasetsResource(),
        "io_manager": ParquetIOManager(),
    },
)
