"""Shared fixtures: the tiny synthetic datasets and what is built from them, once per test
process; an S3-compatible server for a module, and s3fs's client cache cleared around the
tests that use S3. The tiers are markers (pyproject.toml) set in the test modules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import s3fs
from commands import run_ok

from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets

warnings.filterwarnings("ignore", message=".*preview.*", category=Warning)


@pytest.fixture(scope="module")
def fresh_s3_clients_for_module() -> Iterator[None]:
    """No s3fs client kept from before the module, none left to the next one. An S3 module
    names it first in its `pytest.mark.usefixtures`, so that it runs before the module's own
    fixtures.

    s3fs keeps one client per set of options for the life of the process, and the endpoint is
    not among them (botocore reads AWS_ENDPOINT_URL when a client is made). Each module that
    uses S3 starts its own server: a client kept from before would still talk to the previous,
    stopped one."""
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def fresh_s3_clients() -> Iterator[None]:
    """No s3fs client kept from before the test, none left after it: for a module whose tests
    point AWS_ENDPOINT_URL at different servers (see `fresh_s3_clients_for_module`)."""
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="module")
def s3_server(fresh_s3_clients_for_module) -> Iterator[str]:
    """An S3-compatible server (moto, threaded, on loopback) for the module: its endpoint."""
    from e2e_support import free_port
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def on_s3_server(s3_server: str, fresh_s3_clients, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's AWS_* variables pointing at the module's `s3_server` (test credentials)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_server


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All four datasets at tiny scale, with a mixed JPG/DICOM MIMIC tree. Do not modify."""
    root = tmp_path_factory.mktemp("tiny") / "data"
    generate_datasets(root, scale="tiny", seed=7, mimic_format="mixed")
    return root


@pytest.fixture
def tiny_copy(tiny_root: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny datasets that a test may break."""
    copy = tmp_path / "data"
    shutil.copytree(tiny_root, copy)
    return copy


@pytest.fixture
def open_tiny(tiny_root: Path):
    """Open a dataset's reader on the tiny data, ignoring the caller's environment."""

    def opener(dataset: str, root: Path | None = None, **location):
        environ = {"RADHARMONY_DATA_ROOT": str(root or tiny_root)}
        return open_source(dataset, SourceLocation(**location), environ)

    return opener


@pytest.fixture(scope="session")
def tiny_corpus(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every partition of the tiny data materialized with its checks, then the manifest: built
    once per test process for every module that only reads outputs (a rebuild costs seconds
    per partition; `tiny_corpus_copy` gives a test a private copy to change or rebuild on).
    A module that uses it is a `build` module.

    Returns (output root, {partition: result}, manifest result). Do not modify the files.
    """
    from corpus import materialize_corpus

    output = tmp_path_factory.mktemp("tiny-corpus")
    return output, *materialize_corpus(tiny_root, output)


@pytest.fixture
def tiny_corpus_copy(tiny_corpus, tmp_path: Path) -> Path:
    """A private copy of the tiny corpus's outputs (file times kept, as a rerun sees them)."""
    copy = tmp_path / "output"
    shutil.copytree(tiny_corpus[0], copy)
    return copy


@dataclass
class Demo:
    """`radharmony demo` as a new user runs it: its folder (data, output, dagster_home), the
    environment it ran with, its finished process, and the instance's runs right after it."""

    base: Path
    environment: dict[str, str]
    completed: subprocess.CompletedProcess
    runs: list

    @property
    def data_root(self) -> Path:
        return self.base / "data"


@pytest.fixture(scope="session")
def tiny_demo(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """`radharmony demo` once per test process on a private copy of the tiny data, with its own
    DAGSTER_HOME and output: tests/test_cli.py reads its summary and runs, and
    tests/test_e2e_ui.py serves the instance with `dagster dev` (and may change the data).
    A test that uses it is a `build` test."""
    import dagster as dg
    from e2e_support import write_instance

    base = tmp_path_factory.mktemp("demo")
    shutil.copytree(tiny_root, base / "data")
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))
    }
    environment.update(
        DAGSTER_HOME=str(write_instance(base / "dagster_home")),
        RADHARMONY_DATA_ROOT=str(base / "data"),
        RADHARMONY_OUTPUT_ROOT=str(base / "output"),
        RADHARMONY_WORKERS="1",
    )
    radharmony = Path(sys.executable).with_name("radharmony")
    completed = run_ok([str(radharmony), "demo"], cwd=base, env=environment, timeout=900)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", environment["DAGSTER_HOME"])  # read by its dagster.yaml
        with dg.DagsterInstance.get() as instance:
            runs = list(instance.get_runs())
    return Demo(base, environment, completed, runs)


# The session fixtures that build (a corpus, the demo): a test using one, directly or through
# another fixture, carries a tier mark (pyproject.toml declares the tiers), or the fast tier
# would build them.
BUILDING_FIXTURES = frozenset({"tiny_corpus", "tiny_demo"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    untiered = [
        item.nodeid
        for item in items
        if BUILDING_FIXTURES & set(getattr(item, "fixturenames", ()))
        and not any(item.get_closest_marker(tier) for tier in tiers)
    ]
    if untiered:
        raise pytest.UsageError(
            f"{len(untiered)} test(s) use {' or '.join(sorted(BUILDING_FIXTURES))} without a "
            f"tier mark, e.g. {untiered[0]}: add `pytestmark = pytest.mark.build` to the "
            "module, or `@pytest.mark.build` to the test"
        )
