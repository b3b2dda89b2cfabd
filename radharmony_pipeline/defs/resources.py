"""Resources: where each dataset lives, chosen from config, the environment or the data root."""

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from ..processing.settings import strict_mode
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
    strict: bool = Field(
        default_factory=strict_mode,
        description="Fail a step on its first error row (a malformed entry, an undecodable "
        "image) instead of keeping it with status `error`; default RADHARMONY_STRICT.",
    )

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
        description="Folder (or URL, for tables) of all outputs; default RADHARMONY_OUTPUT_ROOT.",
    )

    def local_root(self) -> Path:
        """The output root as a local folder, for files written by worker processes.

        PNGs are written by a process pool with plain file APIs; an object-store root is
        supported for tables only so far, and is refused here with a clear message.
        """
        if "://" in self.output_root and not self.output_root.startswith("file://"):
            raise dg.Failure(
                description=f"output_root {self.output_root!r} is not a local folder; masks "
                "and images are written to local disk (set RADHARMONY_OUTPUT_ROOT to a path)"
            )
        return Path(self.output_root.removeprefix("file://"))
