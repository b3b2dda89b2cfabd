"""Error rows of each stage, reported by reason: warnings, or blocking errors in strict mode.

raw_index's and bboxes' run inside their own steps (checks/index_and_labels.py, bboxes.py).
"""

import dagster as dg
import pandas as pd

from ..partitions import dataset_split_partitions
from ..resources import DatasetsResource
from ..row_errors import row_errors_result

ROW_ERRORS_DESCRIPTION = (
    "Rows with status `error` (the reason names the file, the entry and the field), counted "
    "by reason. A warning, so the good rows still flow; blocks downstream in strict mode "
    "(RADHARMONY_STRICT=1)."
)


@dg.asset_check(
    asset="masks",
    partitions_def=dataset_split_partitions,
    blocking=True,
    description=ROW_ERRORS_DESCRIPTION,
)
def masks_error_rows(masks: pd.DataFrame, datasets: DatasetsResource):
    return row_errors_result(masks, datasets.strict)


@dg.asset_check(
    asset="images",
    partitions_def=dataset_split_partitions,
    blocking=True,
    description=ROW_ERRORS_DESCRIPTION,
)
def images_error_rows(images: pd.DataFrame, datasets: DatasetsResource):
    return row_errors_result(images, datasets.strict)
