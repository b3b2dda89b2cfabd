"""An object store that misbehaves under a run: a fault-injecting proxy (tests/fault_proxy.py,
its own process on loopback) between the pipeline and moto_server answers a share of requests
503/500, cuts connections halfway through request and response bodies, goes down entirely, or
denies a prefix. Datasets and outputs both live on the store, behind the proxy.

A run either completes with objects byte-identical to a fault-free run, or fails with one
clear message, leaves no partial or temporary object, and a re-run once the store is back
completes it to the same bytes. Outputs are published by one PUT each (no temporary key): an
upload cut halfway is refused by the store, which keeps the object it had (or none).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from cluster_services import (
    AWS_ENVIRONMENT,
    BUCKET,
    S3_TESTS,
    Services,
    free_port,
    port_open,
    s3,
    start_moto,
    wait_until,
)
from deadline import within
from fault_support import STAGES, failure_message
from test_sources_on_s3 import DEFINITIONS, restart_forkserver

from radharmony_pipeline.defs.resources import (
    DatasetsResource,
    ObjectStoreRetries,
    OutputsResource,
    pipeline_resources,
)
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.processing.storage.retry_policy import ObjectStoreError, RetryPolicy
from radharmony_pipeline.processing.storage.store import output_path, publish_bytes
from radharmony_pipeline.synthetic import generate_datasets

pytestmark = S3_TESTS

PARTITIONS = ["chestx_det.test", "chexlocalize.val"]
PROXY = Path(__file__).with_name("fault_proxy.py")
# Short waits, so that an outage outlasts them within seconds; enough attempts that 30 %
# faulty requests still pass (0.3 ** 12: about one in two million requests fails for good).
QUICK_RETRIES = ObjectStoreRetries(attempts=12, first_backoff_seconds=0.02, max_backoff_seconds=0.2)


class FaultyStore:
    def __init__(self, services: Services, control: Path) -> None:
        self.services, self.control = services, control

    def set(self, **settings) -> None:
        self.control.write_text(json.dumps(settings))
        time.sleep(0.01)  # a new mtime for the proxy to notice

    def stats(self) -> dict:
        path = self.control.with_name(self.control.name + ".stats")
        return json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("fault-logs")
    services = Services()
    patch = pytest.MonkeyPatch()
    try:
        start_moto(services, logs)
        upstream = int(services.s3_endpoint.rsplit(":", 1)[1])
        control = logs / "faults.json"
        control.write_text("{}")
        port = free_port()
        proxy = services.start(
            [sys.executable, str(PROXY), str(port), str(upstream), str(control)],
            logs / "proxy.log",
        )
        wait_until(lambda: port_open(port), "fault proxy", proxy)
        for name, value in {
            **AWS_ENVIRONMENT,
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }.items():
            patch.setenv(name, value)
        patch.delenv("RADHARMONY_DASK_SCHEDULER", raising=False)
        patch.setenv("RADHARMONY_WORKERS", "2")
        restart_forkserver()
        local = tmp_path_factory.mktemp("store-sources") / "data"
        generate_datasets(local, scale="tiny", seed=7, mimic_format="mixed")
        s3(services).put(f"{local}/", f"{BUCKET}/data/", recursive=True)  # not through the proxy
        yield FaultyStore(services, control)
    finally:
        patch.undo()
        restart_forkserver()
        services.stop()


def run(
    prefix: str, partitions=PARTITIONS, bucket: str = BUCKET
) -> list[dg.ExecuteInProcessResult]:
    data, output = f"s3://{BUCKET}/data", f"s3://{bucket}/{prefix}"
    resources = {
        **pipeline_resources(data, output),
        "datasets": DatasetsResource(data_root=data, store_retries=QUICK_RETRIES),
        "outputs": OutputsResource(output_root=output, store_retries=QUICK_RETRIES),
    }
    return [
        dg.materialize(
            DEFINITIONS,
            partition_key=key,
            resources=resources,
            selection=STAGES.without_checks(),
            instance=dg.DagsterInstance.ephemeral(),
            raise_on_error=False,
        )
        for key in partitions
    ]


def objects(store: FaultyStore, prefix: str) -> dict[str, bytes]:
    """Every object below the prefix, read straight from moto (not through the proxy)."""
    client = s3(store.services)
    base = f"{BUCKET}/{prefix}"
    if not client.exists(base):
        return {}
    return {key[len(base) + 1 :]: client.cat_file(key) for key in client.find(base)}


@pytest.fixture(scope="module")
def reference(store: FaultyStore) -> dict[str, bytes]:
    store.set()
    assert all(result.success for result in run("clean"))
    found = objects(store, "clean")
    assert {name.rsplit(".", 1)[-1] for name in found} >= {"parquet", "png", "npy", "json"}
    assert not [name for name in found if TEMP_MARKER in name]
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("share", [0.1, 0.3])
def test_errors_and_cut_connections_are_retried_to_identical_objects(store, reference, share):
    prefix = f"faulty-{share}"
    store.set(error_rate=share / 2, cut_rate=share / 2)
    try:
        results = run(prefix)
    finally:
        stats = store.stats()
        store.set()
    assert [result.success for result in results] == [True] * len(PARTITIONS)
    # Faults were injected; at the higher share every kind, mid-body cuts of uploads and of
    # downloads each included (at the lower share the few uploads may all escape a cut).
    assert stats["errors"] > 0 and stats["cut_requests"] + stats["cut_responses"] > 0
    if share >= 0.3:
        assert stats["cut_requests"] > 0 and stats["cut_responses"] > 0
    found = objects(store, prefix)
    assert sorted(found) == sorted(reference)
    assert [name for name in found if found[name] != reference[name]] == []


@pytest.mark.timeout(600)
def test_an_outage_longer_than_the_retries_fails_clearly_and_a_rerun_completes(store, reference):
    prefix = "outage"
    partition = PARTITIONS[0]
    # The store goes down after some requests of the run and stays down past the retries.
    store.set(outage_after=60)
    try:
        with within(300, "the run during the outage"):
            (failed,) = run(prefix, [partition])
    finally:
        store.set()
    assert not failed.success
    message = failure_message(failed)
    assert f"s3://{BUCKET}/" in message  # names the object
    assert "kept failing" in message and f"{QUICK_RETRIES.attempts} attempts" in message
    assert "run the same command" in message
    # Whatever was published is complete, and nothing else is there: each output is one PUT
    # (no temporary key to leave behind), and the Dask shards are not used by a local pool.
    during = objects(store, prefix)
    assert not [name for name in during if TEMP_MARKER in name]
    assert all(reference[name] == content for name, content in during.items())

    (rerun,) = run(prefix, [partition])
    assert rerun.success
    expected = {name: content for name, content in reference.items() if partition in name}
    found = objects(store, prefix)
    assert sorted(found) == sorted(expected)
    assert all(found[name] == expected[name] for name in found)


@pytest.mark.timeout(300)
def test_an_upload_cut_halfway_leaves_the_old_object_or_none(store):
    """Every upload either cut halfway through its body (half of it reaches the server, then
    the connection drops) or forwarded whole, with one attempt each. A cut one fails, and the
    object read past the proxy is the one it replaced (or none): the store refused the short
    body. A whole one succeeds with the new object. Never the half that arrived."""
    one_attempt = RetryPolicy(attempts=1, first_backoff=0, max_backoff=0)
    root = output_path(f"s3://{BUCKET}/cut", one_attempt)
    direct = s3(store.services)
    old, new = b"OLD:" + bytes(range(256)) * 200, b"NEW:" + bytes(range(255, -1, -1)) * 300
    names = [f"{kind}-{number}.bin" for kind in ("replaced", "created") for number in range(12)]
    for name in names[:12]:
        direct.pipe_file(f"{BUCKET}/cut/{name}", old)
    failed = set()
    store.set(cut_rate=1.0)
    try:
        for name in names:
            try:
                publish_bytes(root / name, new)
            except ObjectStoreError:
                failed.add(name)
    finally:
        stats = store.stats()
        store.set()
    # Bodies were cut halfway through, and some uploads failed for it (aiohttp sends an
    # idempotent request again once when a reused connection drops, so not every cut fails).
    assert stats["cut_requests"] > 0 and failed
    found = objects(store, "cut")
    for name in names:
        before = old if name.startswith("replaced") else None
        expected = before if name in failed else new
        assert found.get(name) == expected, f"{name}: {len(found.get(name) or b'')} bytes"
    assert not [name for name in found if TEMP_MARKER in name]


@pytest.mark.timeout(300)
def test_access_denied_fails_at_once_naming_the_object(store, reference):
    prefix = "denied"
    store.set(deny_prefix=f"/{BUCKET}/{prefix}")
    try:
        (result,) = run(prefix, PARTITIONS[:1])
        denied = store.stats()["denied"]
    finally:
        store.set()
    assert not result.success
    message = failure_message(result)
    assert f"s3://{BUCKET}/{prefix}/" in message
    assert "access denied (HTTP 403" in message and "credentials" in message
    # Permanent: not retried (one request, not one per attempt).
    assert denied < QUICK_RETRIES.attempts
    assert objects(store, prefix) == {}


@pytest.mark.timeout(300)
def test_a_missing_bucket_fails_at_once_naming_it(store):
    (result,) = run("out", PARTITIONS[:1], bucket="no-such-bucket")
    assert not result.success
    message = failure_message(result)
    assert "s3://no-such-bucket/out/" in message
    assert "the bucket does not exist (NoSuchBucket)" in message
