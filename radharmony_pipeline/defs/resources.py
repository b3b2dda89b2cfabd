"""Resources: where each dataset lives, chosen from config, the environment or the data root."""

import os
from pathlib import Path

import dagster as dg
from pydantic import Field, create_model

from ..processing.settings import strict_mode
from ..processing.source_store import source_path
from ..processing.storage import OutputPath, output_path
from ..sources import SOURCE_TYPES, DatasetSource, SourceLocation, open_source
from ..sources.location import DATA_ROOT_ENV, data_root
from ..sources.nih_chestxray14 import ENV_VAR as NIH_ROOT_ENV
from ..sources.nih_chestxray14 import NihChestXray14

OUTPUT_ROOT_ENV = "RADHARMONY_OUTPUT_ROOT"


class SourceLocationConfig(dg.Config):
    """Paths (or s3:// URLs) for one dataset, under the seed pages' argument names; unset
    means auto-discover."""

    root: str | None = None
    base_image_dir: str | None = None
    csv_path: str | None = None
    mask_json_path: str | None = None


class _DatasetsResourceBase(dg.ConfigurableResource):
    """Opens the reader of each dataset. Unset paths fall back to the RADHARMONY_* variables."""

    data_root: str | None = Field(
        default=None,
        description="Folder or object-store URL (s3://bucket/prefix) of all datasets; default "
        "RADHARMONY_DATA_ROOT.",
    )
    strict: bool = Field(
        default_factory=strict_mode,
        description="Fail a step on its first error row (a malformed entry, an undecodable "
        "image) instead of keeping it with status `error`; default RADHARMONY_STRICT.",
    )

    nih_root: str | None = Field(
        default=None,
        description="NIH ChestX-ray14 download (ChestX-Det's parent); default "
        f"{NIH_ROOT_ENV}, else <data root>/nih-chestxray14 when present.",
    )

    def nih(self) -> NihChestXray14 | None:
        """The NIH ChestX-ray14 download, or None when the user has none."""
        given = self.nih_root or os.environ.get(NIH_ROOT_ENV)
        root = data_root({DATA_ROOT_ENV: self.data_root or os.environ.get(DATA_ROOT_ENV, "")})
        return NihChestXray14.located(source_path(given) if given else None, root)

    def source(self, dataset: str) -> DatasetSource:
        environ = dict(os.environ)
        if self.data_root:
            environ[DATA_ROOT_ENV] = self.data_root
        config = getattr(self, dataset, None) or SourceLocationConfig()
        return open_source(dataset, SourceLocation.from_strings(config.model_dump()), environ)


# One config block per registered dataset, named by its key: a new dataset in
# sources.SOURCE_TYPES gets its launchpad fields without an edit here.
DatasetsResource = create_model(
    "DatasetsResource",
    __base__=_DatasetsResourceBase,
    __doc__=_DatasetsResourceBase.__doc__,
    __module__=__name__,
    **{
        key: (
            SourceLocationConfig,
            Field(
                default_factory=SourceLocationConfig,
                description=f"Where {key} lives; unset fields are discovered.",
            ),
        )
        for key in SOURCE_TYPES
    },
)


class OutputsResource(dg.ConfigurableResource):
    """Where everything the pipeline writes goes: tables, masks, images, previews."""

    output_root: str = Field(
        default_factory=lambda: os.environ.get(OUTPUT_ROOT_ENV) or "data/output",
        description="Folder or object-store URL (s3://bucket/prefix) of all outputs; default "
        "RADHARMONY_OUTPUT_ROOT.",
    )

    def root(self) -> OutputPath:
        """The output root: a local Path, or a UPath on object storage (`s3://bucket/prefix`)."""
        return output_path(self.output_root)


def pipeline_resources(
    data_root: str | Path | None = None, output_root: str | Path | None = None
) -> dict[str, object]:
    """Every resource the assets and checks ask for, under the keys they ask for them by.

    Unset roots come from RADHARMONY_DATA_ROOT / RADHARMONY_OUTPUT_ROOT, read when a run starts
    (dg.EnvVar, so the UI shows where a value comes from), else the documented defaults.
    """
    from .io_managers import parquet_io_manager

    datasets = DatasetsResource(data_root=_setting(data_root, DATA_ROOT_ENV))
    outputs = OutputsResource(output_root=_setting(output_root, OUTPUT_ROOT_ENV) or "data/output")
    return {"datasets": datasets, "outputs": outputs, "io_manager": parquet_io_manager}


def _setting(value: str | Path | None, env_var: str) -> str | dg.EnvVar | None:
    if value is not None:
        return str(value)
    return dg.EnvVar(env_var) if os.environ.get(env_var) else None
