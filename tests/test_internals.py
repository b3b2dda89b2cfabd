"""The one door to other packages' internals (radharmony_pipeline/internals.py): no other
module of the package reaches a non-public Dagster, upath or webdataset name, and each one the
adapter reaches still behaves as it relies on, so an upgrade that changes one fails here."""

from __future__ import annotations

import ast
import inspect
import pickle
import sys
from pathlib import Path

import dagster as dg
import pytest
import webdataset  # noqa: F401  (loads webdataset.gopen, the module)
from upath import UPath
from upath.implementations.cloud import S3Path
from upath.registry import get_upath_class

import radharmony_pipeline
from radharmony_pipeline import internals
from radharmony_pipeline.processing.storage.retry_policy import (
    RETRY_OPTION,
    RetryPolicy,
    retry_policy_of,
)
from radharmony_pipeline.processing.storage.store import output_path

PACKAGE = Path(radharmony_pipeline.__file__).parent
# webdataset's package-level `gopen` is the function; its table of openers is the module's.
GOPEN = sys.modules["webdataset.gopen"]
ADAPTER = Path(internals.__file__)
# Attributes, functions and names the adapter alone may touch.
INTERNAL_NAMES = {
    "event_log_storage",
    "report_run_failed",
    "free_concurrency_slots_for_run",
    "get_concurrency_run_ids",
    "get_concurrency_info",
    "supports_global_concurrency_limits",
    "create_run_for_job",
    "_handle_transition_to_partitioned_asset",
    "_fs_factory",
    "_protocol_dispatch",
    "register_implementation",
    "gopen_schemes",
}
# Modules the adapter alone may import from.
INTERNAL_MODULES = ("dagster._", "upath.registry", "upath.implementations", "webdataset.gopen")


def internal_uses(path: Path) -> list[str]:
    """Each place in `path` that imports from an internal module or names an internal name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(INTERNAL_MODULES):
            found.append(f"{node.lineno}: from {node.module}")
        elif isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith(INTERNAL_MODULES)
            ]
        elif isinstance(node, ast.Attribute) and node.attr in INTERNAL_NAMES:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in INTERNAL_NAMES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.FunctionDef) and node.name in INTERNAL_NAMES:
            found.append(f"{node.lineno}: def {node.name}")
    return found


def test_only_the_adapter_reaches_the_internals():
    touching = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := internal_uses(path))
    }
    assert list(touching) == ["internals.py"], touching


def test_the_scan_sees_each_kind_of_use(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from dagster._core.execution.api import execute_run\n"
        "import webdataset.gopen\n"
        "instance.event_log_storage.free_concurrency_slots_for_run(run_id)\n"
        "class P:\n"
        "    def _fs_factory(cls): ...\n"
    )
    assert len(internal_uses(probe)) == 5


# --- Dagster ---------------------------------------------------------------------------------


def test_dagster_still_records_and_executes_an_origin_bearing_run_as_the_adapter_calls_it():
    from dagster._core.execution.api import execute_run
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._utils.hosted_user_process import recon_job_from_origin

    assert list(inspect.signature(execute_run).parameters)[:3] == ["job", "dagster_run", "instance"]
    assert list(inspect.signature(recon_job_from_origin).parameters) == ["origin"]
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="radharmony_pipeline.definitions"),
        location_name="radharmony_pipeline",
    )
    assert callable(origin.create_location)
    expected = {"job_def", "run_config", "tags", "remote_job_origin", "job_code_origin", "run_id"}
    assert expected <= set(inspect.signature(dg.DagsterInstance.create_run_for_job).parameters)


def test_the_instance_still_exposes_the_slot_calls_recovery_uses():
    """Static: making an instance costs seconds. test_crash_recovery.py (slow tier) frees the
    slots of a killed run through these calls."""
    from dagster._core.storage.event_log.base import EventLogStorage

    assert isinstance(inspect.getattr_static(dg.DagsterInstance, "event_log_storage"), property)
    assert "message" in inspect.signature(dg.DagsterInstance.report_run_failed).parameters
    for method, parameters in {
        "free_concurrency_slots_for_run": ["self", "run_id"],
        "get_concurrency_run_ids": ["self"],
        "get_concurrency_info": ["self", "concurrency_key"],
    }.items():
        assert list(inspect.signature(getattr(EventLogStorage, method)).parameters) == parameters
    supports = inspect.getattr_static(EventLogStorage, "supports_global_concurrency_limits")
    assert isinstance(supports, property)


def test_upath_io_manager_still_looks_up_the_partitions_folder_through_the_overridden_method():
    method = dg.UPathIOManager._handle_transition_to_partitioned_asset
    assert list(inspect.signature(method).parameters) == ["self", "context", "path"]
    assert "self._handle_transition_to_partitioned_asset(" in inspect.getsource(dg.UPathIOManager)


# --- upath -----------------------------------------------------------------------------------


def test_nothing_is_registered_with_upath_when_the_package_loads():
    import radharmony_pipeline.definitions
    import radharmony_pipeline.loader  # noqa: F401

    assert get_upath_class("s3") is S3Path
    assert get_upath_class("s3a") is S3Path


def test_an_object_store_path_keeps_its_retry_policy_and_keeps_it_from_s3fs():
    policy = RetryPolicy(attempts=3, first_backoff=0.5, max_backoff=2.0)
    root = output_path("s3://bucket/prefix", policy)
    relatives = [root / "tables" / "x.parquet", root.parent, pickle.loads(pickle.dumps(root))]
    for path in [root, *relatives, UPath(root)]:
        assert isinstance(path, S3Path), type(path)
        assert retry_policy_of(path) == policy, path
    fs = (root / "tables").fs
    assert RETRY_OPTION not in fs.storage_options
    assert fs.retries == 1
    # A path made outside the storage layer is upath's own, with s3fs's own retries.
    plain = UPath("s3://bucket/prefix", anon=True)
    assert type(plain) is S3Path and plain.fs.retries > 1


# --- webdataset ------------------------------------------------------------------------------


def test_webdataset_opens_an_added_scheme_through_the_given_opener():
    opened = []

    def opener(url, mode="rb", bufsize=8192, **_):
        opened.append((url, mode))
        return open(__file__, mode)

    scheme = "radharmony-test"
    try:
        internals.add_webdataset_opener(scheme, opener)
        with GOPEN.gopen(f"{scheme}://bucket/shard.tar") as stream:
            assert stream.read(3) == Path(__file__).read_bytes()[:3]
    finally:
        GOPEN.gopen_schemes.pop(scheme, None)
    assert opened == [(f"{scheme}://bucket/shard.tar", "rb")]


def test_a_scheme_webdataset_opens_keeps_its_own_opener():
    before = GOPEN.gopen_schemes["http"]
    internals.add_webdataset_opener("http", lambda *a, **k: pytest.fail("replaced"))
    assert GOPEN.gopen_schemes["http"] is before
