"""Parquet tables at `<output>/tables/<asset>/<partition>.parquet`, local or on object storage."""

import dagster as dg
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from upath import UPath

from ..processing.storage import output_path, publish
from .metadata import table_metadata
from .resources import OutputsResource


class ParquetTableIOManager(dg.UPathIOManager):
    """Writes each partition's DataFrame as one Parquet file, never visible half-written."""

    extension = ".parquet"

    def dump_to_path(self, context: dg.OutputContext, obj: pd.DataFrame, path: UPath) -> None:
        table = pa.Table.from_pandas(obj, preserve_index=False)
        publish(path, lambda handle: pq.write_table(table, handle))

    def load_from_path(self, context: dg.InputContext, path: UPath) -> pd.DataFrame:
        with path.open("rb") as handle:
            return pq.read_table(handle).to_pandas()

    def get_metadata(self, context: dg.OutputContext, obj: pd.DataFrame) -> dict:
        return table_metadata(obj)


class ParquetIOManager(dg.ConfigurableIOManagerFactory):
    """Tables under `<output_root>/tables`; `output_root` may be a local folder or `s3://...`.

    The root comes from the shared `outputs` resource, so tables, masks and images always land
    under the same root whatever the launchpad sets.
    """

    outputs: OutputsResource

    def create_io_manager(self, context: dg.InitResourceContext) -> ParquetTableIOManager:
        return ParquetTableIOManager(
            base_path=UPath(output_path(self.outputs.output_root)) / "tables"
        )
