"""Resources: where each dataset lives, chosen from config, the environment or the data root."""

import os

import dagster as dg
from pydantic import Field

from ..processing.storage import OutputPath, output_path
from ..sources import DatasetSource, SourceLocation, open_source
from ..sources.location import DATA_ROOT_ENV


class SourceLocationConfig(dg.Config):
    """Paths for one dataset, under the seed pages' argument names; unset means auto-discover."""

    root: str | None = None
    base_image_dir: str | None = None
    csv_path: str | None = None
    mask_json_path: str | None = None


class DatasetsResource(dg.ConfigurableResource):
    """Opens the reader of each dataset. Unset paths fall back to the RADHARMONY_* variables."""

    data_root: str | None = Field(
        default=None, description="Folder of all datasets; default RADHARMONY_DATA_ROOT."
    )
    chexlocalize: SourceLocationConfig = Field(default_factory=SourceLocationConfig)
    ms_cxr: SourceLocationConfig = Field(default_factory=SourceLocationConfig)
    chestx_det: SourceLocationConfig = Field(default_factory=SourceLocationConfig)
    rexgradient: SourceLocationConfig = Field(default_factory=SourceLocationConfig)

    def source(self, dataset: str) -> DatasetSource:
        environ = dict(os.environ)
        if self.data_root:
            environ[DATA_ROOT_ENV] = self.data_root
        config: SourceLocationConfig = getattr(self, dataset)
        return open_source(dataset, SourceLocation.from_strings(config.model_dump()), environ)


class OutputsResource(dg.ConfigurableResource):
    """Where everything the pipeline writes goes: tables, masks, images, previews."""

    output_root: str = Field(
        default_factory=lambda: os.environ.get("RADHARMONY_OUTPUT_ROOT") or "data/output",
        description="Folder or object-store URL (s3://bucket/prefix) of all outputs; default "
        "RADHARMONY_OUTPUT_ROOT.",
    )

    def root(self) -> OutputPath:
        """The output root: a local Path, or a UPath on object storage (`s3://bucket/prefix`)."""
        return output_path(self.output_root)
