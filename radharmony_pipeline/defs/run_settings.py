"""The one run-time resource: how a run computes (workers, time limit, Dask, failure limits,
strict mode).

Each field is run config (the launchpad's `run_settings` block) whose default is read from
its RADHARMONY_* variable by the parser in settings.py, which holds its default
value and bounds; assets and checks take the values from here and hand them down as plain
values, so nothing below defs/ reads the environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar

import dagster as dg
from pydantic import Field

from .. import settings
from ..processing.execution.cluster import DaskCluster, Executor, LocalPool
from ..processing.execution.supervised import TimeLimit

T = TypeVar("T")
R = TypeVar("R")


def from_environment(parse: Callable[[Mapping[str, str]], T]) -> Callable[[], T]:
    """A config default: `parse` applied to this process's environment when the config is
    built (a bad variable raises ConfigurationError naming it)."""
    return lambda: parse(os.environ)


def validate_environment() -> None:
    """Check every RADHARMONY_* setting of this process once, before any work."""
    settings.validate_settings(os.environ)


class RunSettingsResource(dg.ConfigurableResource):
    """How this run computes; every field defaults to its RADHARMONY_* variable, else to the
    documented default."""

    workers: int = Field(
        default_factory=from_environment(settings.worker_count),
        ge=1,
        description="Local worker processes for per-image work; default "
        f"{settings.WORKERS_VARIABLE}, else the machine's CPU count.",
    )
    job_timeout_seconds: float = Field(
        default_factory=from_environment(settings.job_timeout),
        gt=0,
        allow_inf_nan=False,
        description="Longest time one image may take in `masks` or `images` before its "
        "worker is stopped and the image becomes an error row; default "
        f"{settings.TIMEOUT_VARIABLE}, else {settings.DEFAULT_TIMEOUT_SECONDS:g}.",
    )
    dask_scheduler: str | None = Field(
        default_factory=from_environment(settings.dask_scheduler),
        description="Address of a Dask scheduler (tcp://host:8786) to send the per-image "
        "chunks of `masks` and `images` to; unset runs them on the local pool. Default "
        f"{settings.SCHEDULER_VARIABLE}.",
    )
    unreadable_limit: float = Field(
        default_factory=from_environment(settings.unreadable_limit),
        ge=0,
        le=1,
        description="Share (0 to 1) of a partition's images that may be missing or "
        "unreadable for one reason before its step fails (1 never fails); default "
        f"{settings.UNREADABLE_LIMIT_VARIABLE}, else {settings.DEFAULT_UNREADABLE_LIMIT}.",
    )
    strict: bool = Field(
        default_factory=from_environment(settings.strict_mode),
        description="Fail a step on its first error row (a malformed entry, an undecodable "
        f"image) instead of keeping it with status `error`; default {settings.STRICT_VARIABLE}, "
        "else off.",
    )
    parent_leaks: Literal["warn", "block"] = Field(
        default_factory=from_environment(settings.parent_leaks),
        description="`block` makes leaks against the parent datasets' splits fail their "
        "checks as errors (the manifest waits); `warn` only warns. Default "
        f"{settings.PARENT_LEAKS_VARIABLE}, else {settings.DEFAULT_PARENT_LEAKS}.",
    )

    def executor(self) -> Executor:
        """Where per-image work runs: the Dask cluster when a scheduler is set, else the
        local pool; chosen here only."""
        address = (self.dask_scheduler or "").strip()
        return DaskCluster(address) if address else LocalPool(self.workers)

    def time_limit(self, on_timeout: Callable[[T, str], R]) -> TimeLimit[T, R]:
        """The per-image bound; a stopped image's reason names where it is set."""
        return TimeLimit(self.job_timeout_seconds, on_timeout, settings.TIMEOUT_VARIABLE)

    def parent_leaks_block(self) -> bool:
        return self.parent_leaks == "block"
