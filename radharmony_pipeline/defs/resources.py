"""Resources: where each dataset lives, chosen from config, the environment or the data root."""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr, create_model

from ..processing.storage.retry_policy import DEFAULT_RETRY_POLICY, RetryPolicy
from ..processing.storage.source_store import is_remote, source_path
from ..processing.storage.store import OutputPath, output_path
from ..processing.tables.suite_validation import SuiteValidation, Validator
from ..settings import (
    DATA_ROOT_VARIABLE,
    DEFAULT_DATA_ROOT,
    DEMO_OUTPUT_ROOT,
    OUTPUT_ROOT_VARIABLE,
    REAL_OUTPUT_ROOT,
)
from ..sources import SOURCE_TYPES, DatasetSource, SourceLocation, open_source
from ..sources.location import data_root, expand_path
from ..sources.nih_chestxray14 import ENV_VAR as NIH_ROOT_VARIABLE
from ..sources.nih_chestxray14 import NihChestXray14
from .run_settings import RunSettingsResource


def uses_demo_data(environ: Mapping[str, str] = os.environ) -> bool:
    """No dataset variable set, and the data root is the demo's default folder."""
    variables = [var for source in SOURCE_TYPES.values() for var in source.env_vars.values()]
    if any(environ.get(var) for var in variables):
        return False
    root = data_root(environ)
    return not is_remote(root) and Path(root).resolve() == Path(DEFAULT_DATA_ROOT).resolve()


def default_output_root(environ: Mapping[str, str] = os.environ) -> str:
    """RADHARMONY_OUTPUT_ROOT, else the demo's or the real data's default output root."""
    if environ.get(OUTPUT_ROOT_VARIABLE):
        return expand_path(environ[OUTPUT_ROOT_VARIABLE], environ)
    return DEMO_OUTPUT_ROOT if uses_demo_data(environ) else REAL_OUTPUT_ROOT


class SourceLocationConfig(dg.Config):
    """Paths (or s3:// URLs) for one dataset, under the seed pages' argument names; unset
    means auto-discover."""

    root: str | None = None
    base_image_dir: str | None = None
    csv_path: str | None = None
    mask_json_path: str | None = None


class ObjectStoreRetries(dg.Config):
    """How often a request to an object store (s3://) is tried before the step fails:
    throttling (503 SlowDown), 5xx answers, timeouts and cut connections are retried with
    exponential backoff; access denied or a missing bucket fail at once."""

    attempts: int = Field(
        default=DEFAULT_RETRY_POLICY.attempts, ge=1, description="Tries per request."
    )
    first_backoff_seconds: float = Field(
        default=DEFAULT_RETRY_POLICY.first_backoff,
        ge=0,
        description="Wait after the first failure; doubled after each further one.",
    )
    max_backoff_seconds: float = Field(
        default=DEFAULT_RETRY_POLICY.max_backoff, ge=0, description="Longest single wait."
    )

    def policy(self) -> RetryPolicy:
        return RetryPolicy(self.attempts, self.first_backoff_seconds, self.max_backoff_seconds)


def _retries_field(what: str) -> Any:
    return Field(
        default_factory=ObjectStoreRetries,
        description=f"Retries of requests to the object store holding {what} (s3:// only).",
    )


class _DatasetsResourceBase(dg.ConfigurableResource):
    """Opens the reader of each dataset. Unset paths fall back to the RADHARMONY_* variables."""

    data_root: str | None = Field(
        default=None,
        description="Folder or object-store URL (s3://bucket/prefix) of all datasets; default "
        f"{DATA_ROOT_VARIABLE}.",
    )
    store_retries: ObjectStoreRetries = _retries_field("the datasets")

    nih_root: str | None = Field(
        default=None,
        description="NIH ChestX-ray14 download (ChestX-Det's parent); default "
        f"{NIH_ROOT_VARIABLE}, else <data root>/nih-chestxray14 when present.",
    )

    def nih(self) -> NihChestXray14 | None:
        """The NIH ChestX-ray14 download, or None when the user has none."""
        given = self.nih_root or os.environ.get(NIH_ROOT_VARIABLE)
        environ = dict(os.environ)
        if self.data_root:
            environ[DATA_ROOT_VARIABLE] = self.data_root
        policy = self.store_retries.policy()
        located = source_path(expand_path(given, environ), policy) if given else None
        return NihChestXray14.located(located, data_root(environ, policy))

    def source(self, dataset: str) -> DatasetSource:
        environ = dict(os.environ)
        if self.data_root:
            environ[DATA_ROOT_VARIABLE] = self.data_root
        config = getattr(self, dataset, None) or SourceLocationConfig()
        policy = self.store_retries.policy()
        location = SourceLocation.from_strings(config.model_dump(), environ, policy)
        return open_source(dataset, location, environ, policy)


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
        default_factory=default_output_root,
        description="Folder or object-store URL (s3://bucket/prefix) of all outputs; default "
        f"{OUTPUT_ROOT_VARIABLE}, else {DEMO_OUTPUT_ROOT} for the demo datasets and "
        f"{REAL_OUTPUT_ROOT} for any other data.",
    )
    store_retries: ObjectStoreRetries = _retries_field("the outputs")

    def root(self) -> OutputPath:
        """The output root: a local Path, or a UPath on object storage (`s3://bucket/prefix`)."""
        return output_path(expand_path(self.output_root, os.environ), self.store_retries.policy())


class SuiteValidationResource(dg.ConfigurableResource):
    """Where the run's GX suites are validated (processing/tables/suite_validation.py): one
    SuiteValidation for the steps the run's process executes (every step, by default), so a
    helper started by ReXGradient train's read also validates the tables of its later steps
    rather than GX being imported a second time; the helper stops with the run."""

    _validation: SuiteValidation = PrivateAttr()

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._validation = SuiteValidation()

    def for_source(self, source_bytes: int) -> Validator:
        return self._validation.for_source(source_bytes)

    def validator(self) -> Validator:
        return self._validation.validator()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self._validation.close()


def pipeline_resources(
    data_root: str | Path | None = None, output_root: str | Path | None = None
) -> dict[str, object]:
    """Every resource the assets and checks ask for, under the keys they ask for them by.

    Unset roots come from RADHARMONY_DATA_ROOT / RADHARMONY_OUTPUT_ROOT, read when a run starts
    (dg.EnvVar, so the UI shows where a value comes from), else the documented defaults.
    """
    from .io_managers import parquet_io_manager

    datasets = DatasetsResource(data_root=_setting(data_root, DATA_ROOT_VARIABLE))
    outputs = OutputsResource(
        output_root=_setting(output_root, OUTPUT_ROOT_VARIABLE) or default_output_root()
    )
    return {
        "datasets": datasets,
        "outputs": outputs,
        "run_settings": RunSettingsResource(),
        "suite_validation": SuiteValidationResource(),
        "io_manager": parquet_io_manager,
    }


def _setting(value: str | Path | None, env_var: str) -> str | dg.EnvVar | None:
    if value is not None:
        return str(value)
    return dg.EnvVar(env_var) if os.environ.get(env_var) else None
