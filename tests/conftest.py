"""Shared fixtures: tiny synthetic datasets (generated once per session) and Dagster resources."""

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
import tiers

from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets

warnings.filterwarnings("ignore", message=".*preview.*", category=Warning)

# `make test` runs two pytest processes (`pytest -n 2 --dist loadfile`, pytest-xdist). A work
# unit goes to one process: a test module, or every module listed below for one of the costly
# session fixtures (so it is built once), and the long units are handed out first so that
# neither process is left with one at the end. (xdist's own `loadgroup` marks do not reach
# the scheduler under pytest 9.2, hence this hook.) Collection fails when a module uses one of
# these fixtures without being listed with it.
SHARED_SESSION_FIXTURES = {
    "tiny_corpus": (
        "test_automation.py",
        "test_exports.py",
        "test_fault_injection.py",
        "test_images_and_manifest.py",
        "test_masks_and_boxes_stage.py",
        "test_outputs_contract.py",
    ),
    "tiny_demo": ("test_cli.py", "test_e2e_ui.py"),
}
LONG_UNITS = ("test_cluster.py", "tiny_corpus", "test_crash_recovery.py", "tiny_demo")
_UNIT_OF_MODULE = {
    module: fixture for fixture, modules in SHARED_SESSION_FIXTURES.items() for module in modules
}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def work_unit(nodeid: str) -> str:
    """The session fixture whose group lists the module, else the module's file name."""
    module = module_of(nodeid)
    return _UNIT_OF_MODULE.get(module, module)


def long_units_first(nodeid: str) -> int:
    unit = work_unit(nodeid)
    return LONG_UNITS.index(unit) if unit in LONG_UNITS else len(LONG_UNITS)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the order the workers collected in
    return SharedFixtureScheduling(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--unimported-modules",
        default=None,
        metavar="MODULES",
        help="fail unless the package modules the selected tests never import are exactly "
        "these (space-separated; empty: none); `make test-fast` passes the Makefile's list",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A test module whose `pytestmark` the `-m` expression excludes is not even imported: its
    imports would count as the selection's in the --unimported-modules check (and cost time)."""
    markexpr = config.getoption("markexpr")
    is_test_module = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if is_test_module and markexpr:
        return tiers.excludes_every_test(markexpr, tiers.module_markers(collection_path)) or None
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the build marks must be on by then
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers.mark_build_fixture_users(items)
    for item in items:
        for fixture in SHARED_SESSION_FIXTURES:
            if fixture in getattr(item, "fixturenames", ()) and work_unit(item.nodeid) != fixture:
                raise pytest.UsageError(
                    f"{module_of(item.nodeid)} uses the session fixture {fixture}: add it to "
                    "SHARED_SESSION_FIXTURES in tests/conftest.py so it shares one process"
                )
    if hasattr(config, "workerinput"):  # an xdist worker: the long units first (stable sort)
        items.sort(key=lambda item: long_units_first(item.nodeid))


_modules_imported_by_workers: set[str] = set()
_unimported_report = pytest.StashKey[list[str]]()


def pytest_testnodedown(node, error) -> None:
    _modules_imported_by_workers.update(node.workeroutput.get("imported_modules", ()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    imported = tiers.imported_package_modules()
    if hasattr(session.config, "workerinput"):  # an xdist worker: reported to the controller
        session.config.workeroutput["imported_modules"] = sorted(imported)
        return
    expected = session.config.getoption("unimported_modules")
    if expected is None:
        return
    agreed, lines = tiers.unimported_modules_report(
        imported | _modules_imported_by_workers, set(expected.split())
    )
    session.config.stash[_unimported_report] = lines
    if not agreed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for line in config.stash.get(_unimported_report, []):
        terminalreporter.write_line(line)


def _forget_object_store_clients() -> Iterator[None]:
    # s3fs keeps one client per set of options for the life of the process, and the endpoint
    # is not among them (botocore reads AWS_ENDPOINT_URL when a client is made). Modules here
    # each start their own S3-compatible server, and some tests point the variable elsewhere:
    # a client kept from before would still talk to the previous, stopped server.
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


fresh_object_store_clients_per_module = pytest.fixture(autouse=True, scope="module")(
    _forget_object_store_clients
)
fresh_object_store_clients_per_test = pytest.fixture(autouse=True)(_forget_object_store_clients)


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
    once per session for every module that only reads outputs (a rebuild costs seconds per
    partition; `tiny_corpus_copy` gives a test a private copy to change or rebuild on).

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
    """`radharmony demo` once per session on a private copy of the tiny data, with its own
    DAGSTER_HOME and output: tests/test_cli.py reads its summary and runs, and
    tests/test_e2e_ui.py serves the instance with `dagster dev` (and may change the data)."""
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
    completed = subprocess.run(
        [str(radharmony), "demo"],
        cwd=base,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", environment["DAGSTER_HOME"])  # read by its dagster.yaml
        with dg.DagsterInstance.get() as instance:
            runs = list(instance.get_runs())
    return Demo(base, environment, completed, runs)
