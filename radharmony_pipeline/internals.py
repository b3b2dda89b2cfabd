"""The one door to other packages' non-public parts: every use of a name Dagster,
universal-pathlib (upath) or webdataset does not publish is here, with why the pipeline needs
it and the public route it waits for.

tests/test_internals.py fails loudly when an upgrade changes one of them, and finds no other
module of the package reaching them. Dagster is imported inside the functions that use it:
processing/ imports this module for its object-store path, and pool workers must not load
Dagster (seconds each).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO

from upath import UPath
from upath.implementations.cloud import S3Path

from .processing.storage.retry_policy import RETRY_OPTION, with_retries

if TYPE_CHECKING:
    import dagster as dg
    from dagster._core.execution.execution_result import ExecutionResult
    from dagster._core.remote_representation.code_location import CodeLocation
    from dagster._core.storage.dagster_run import DagsterRun

__all__ = [
    "RetriedPartitionsFolderLookup",
    "add_webdataset_opener",
    "concurrency_run_ids",
    "free_concurrency_slots",
    "in_process_code_location",
    "mark_run_failed",
    "pool_slots",
    "run_with_origin",
    "s3_path",
    "supports_pool_slots",
]


# --- Dagster: a run that names its code location, executed in this process ------------------
# Why: the UI's Overview timeline and job pages list only runs that carry the origin of the
# code location they came from; `execute_in_process` records none, so the demo's runs would
# be invisible there. Dagster 1.13 publishes no call that records an origin-bearing run and
# executes it in the calling process. Waits for: dagster-io/dagster#17707 (open).


@contextmanager
def in_process_code_location(
    instance: dg.DagsterInstance, module_name: str, location_name: str
) -> Iterator[CodeLocation]:
    """The code location of `module_name`'s definitions, loaded in this process under
    `location_name` (the name the UI lists it under)."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name=module_name, working_directory=os.getcwd()),
        location_name=location_name,
    )
    with origin.create_location(instance) as location:
        yield location


def run_with_origin(
    location: CodeLocation,
    instance: dg.DagsterInstance,
    repository: str,
    job_name: str,
    run_config: Mapping[str, Any],
    tags: Mapping[str, str],
    run_id: str | None = None,
) -> ExecutionResult:
    """Record a run of `job_name` (the job's own tags plus `tags`) that names `location`'s
    origin, and execute it in this process."""
    from dagster._core.execution.api import execute_run
    from dagster._utils.hosted_user_process import recon_job_from_origin

    remote_job = location.get_repository(repository).get_full_job(job_name)
    recon_job = recon_job_from_origin(remote_job.get_python_origin())
    run = instance.create_run_for_job(
        job_def=recon_job.get_definition(),
        run_config=dict(run_config),
        tags={**remote_job.tags, **tags},
        remote_job_origin=remote_job.get_remote_origin(),
        job_code_origin=remote_job.get_python_origin(),
        run_id=run_id,
    )
    return execute_run(recon_job, run, instance)


# --- Dagster: the pool slots of runs whose process died ---------------------------------------
# Why: a run killed with `kill -9` keeps its pool slots, and run monitoring cannot tell that a
# default-launched run's worker died (operations/recovery.py). The instance's public API has
# no call that lists the runs holding slots, reads a pool's claims or frees a run's slots;
# they are methods of its event log storage, which `DagsterInstance` does not publish, and
# `report_run_failed` is not marked public either. Waits for: a public slot API on
# `DagsterInstance` (none in 1.13; the UI's "free slots" action calls the same storage method).


def supports_pool_slots(instance: dg.DagsterInstance) -> bool:
    """Whether the instance's storage keeps pool (concurrency) slots at all."""
    return bool(instance.event_log_storage.supports_global_concurrency_limits)


def concurrency_run_ids(instance: dg.DagsterInstance) -> set[str]:
    """Every run holding or waiting for a pool slot."""
    return set(instance.event_log_storage.get_concurrency_run_ids())


def pool_slots(instance: dg.DagsterInstance, pool: str) -> Any:
    """The pool's slot count, claimed slots (`claimed_slots`, each with its `run_id`) and
    waiting runs (`pending_run_ids`): Dagster's ConcurrencyKeyInfo."""
    return instance.event_log_storage.get_concurrency_info(pool)


def free_concurrency_slots(instance: dg.DagsterInstance, run_id: str) -> None:
    """Release every slot run `run_id` holds or waits for."""
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)


def mark_run_failed(instance: dg.DagsterInstance, run: DagsterRun, message: str) -> None:
    """Record `run` as failed, with `message` in its log."""
    instance.report_run_failed(run, message=message)


# --- Dagster: UPathIOManager's look-up of a partitioned asset's folder ------------------------
# Why: before writing a partition, UPathIOManager checks whether a file sits where the
# partitions' folder goes; that request goes to the store outside the IO manager's public
# hooks (path_exists, make_directory, unlink), so it would escape the retry policy. Waits
# for: the look-up made through the public `path_exists` hook.


class RetriedPartitionsFolderLookup:
    """A `dg.UPathIOManager` mixin (listed before it): Dagster's look-up of a file where a
    partitioned asset's folder goes, made under the path's retry policy."""

    def _handle_transition_to_partitioned_asset(self, context: Any, path: UPath) -> None:
        parent = super()
        with_retries(
            path,
            "look up the partitions' folder",
            lambda: parent._handle_transition_to_partitioned_asset(context, path),  # type: ignore[attr-defined]
        )


# --- upath: an s3:// path that carries the retry policy among its options ---------------------
# Why: the policy must travel with the path to every process it is pickled to (pool workers,
# Dask), and a path pickles as its URL and options; but s3fs would hand an unknown option to
# botocore's session, and s3fs's own retry loop (a class attribute, no option) would multiply
# the attempts. upath's public API has no hook between a path's options and the filesystem it
# makes, so the path class overrides `_fs_factory`; `_protocol_dispatch = False` lets the class
# be used without registering it as upath's s3 implementation, which would replace every
# s3:// UPath of the process. upath 0.3 deprecates that switch for `upath.extensions.ProxyUPath`,
# which wraps a path but cannot change the filesystem the wrapped path makes. Waits for: a
# public filesystem-factory hook in universal-pathlib (none in 0.3). The option, RETRY_OPTION,
# is the retry policy's own (processing/storage/retry_policy.py).


class _RetryPolicyS3Path(S3Path):
    _protocol_dispatch = False

    @classmethod
    def _fs_factory(cls, urlpath: str, protocol: str, storage_options: Any) -> Any:
        options = {k: v for k, v in storage_options.items() if k != RETRY_OPTION}
        fs = super()._fs_factory(urlpath, protocol, options)
        if RETRY_OPTION in storage_options:
            fs.retries = 1  # one attempt per s3fs call: the pipeline's policy retries
        return fs


def s3_path(url: str, options: Mapping[str, Any]) -> UPath:
    """An `s3://` (or `s3a://`) path whose `RETRY_OPTION` stays with the path (and its
    children, parents and pickles) but never reaches s3fs."""
    protocol = url.split("://", 1)[0]
    return _RetryPolicyS3Path(url, protocol=protocol, **options)


# --- webdataset: an opener for object-store URLs ----------------------------------------------
# Why: `webdataset.WebDataset(urls)` opens each URL through its `gopen`, whose table of openers
# by scheme has none for s3 and no public call to add one. Waits for: a public registration
# call in webdataset (none in 1.0); the alternative, `pipe:` URLs, needs a command-line client.


def add_webdataset_opener(scheme: str, opener: Callable[..., BinaryIO]) -> None:
    """Let webdataset open `scheme://` URLs with `opener(url, mode, bufsize, **kw)`; a scheme
    webdataset already opens keeps its own opener."""
    # webdataset's package-level `gopen` is the function: the table is the module's.
    from webdataset.gopen import gopen_schemes

    gopen_schemes.setdefault(scheme, opener)
