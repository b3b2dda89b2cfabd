"""End to end through the UI server, in headless Chromium against `dagster dev` on loopback.

1. Tiny data, one partition of `all_stages` launched over GraphQL, its checks read back, the
   lineage graph (test-artifacts/ui-lineage.png -> docs/ui-screenshot.png).
2. A freshly built demo instance (`radharmony demo`, then `dagster dev`): the demo's runs under
   the project's job (Runs, job page, Overview timeline), `positives_without_masks` passed for
   the documented CheXlocalize case, the manifest's column lineage, a column description on a
   schema, and after one annotation file changes and is observed, the partition marked
   Unsynced with the observation naming the file (test-artifacts/ui-*.png).

Needs Debian's chromium at /usr/bin/chromium (`make test` installs it) and the `playwright` Python
package (the `dev` extra); no browser is downloaded. Screenshots are copied to docs/ when
RADHARMONY_UPDATE_SCREENSHOT=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError
from e2e_support import REPOSITORY_NAME, DagsterDev, free_port, write_instance

from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB
from radharmony_pipeline.processing.tables.table_schemas import PARTITION_TABLES

REPO = Path(__file__).resolve().parents[1]
LOCATION = "radharmony_pipeline"
PARTITION = "chestx_det.test"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Asset -> its group. In the lineage graph an expanded group shows a header with its name
# above its assets, so an asset named like its group appears twice.
ASSET_GROUPS = {
    "source_files": "sources",
    "raw_index": "annotations",
    "labels": "annotations",
    "masks": "annotations",
    "bboxes": "annotations",
    "images": "pixels",
    "unified_manifest": "corpus",
    "near_duplicates": "corpus",
    "corpus_profile": "corpus",
    "partition_profile": "corpus",
}
CHECKED_ASSETS = PARTITION_TABLES
RUN_TIMEOUT = 240.0
UI_TIMEOUT_MS = 60_000

# The GraphQL client's gql dependency deprecates the call style the client itself uses.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings(
        "ignore:Using variable_values and operation_name:DeprecationWarning"
    ),
]

RUN_EVENTS = """
query RunEvents($runId: ID!, $after: String) {
  logsForRun(runId: $runId, afterCursor: $after, limit: 1000) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events {
        __typename
        ... on MessageEvent { message }
        ... on AssetCheckEvaluationEvent {
          evaluation { checkName assetKey { path } success severity partition }
        }
        ... on MaterializationEvent { assetKey { path } partition }
      }
    }
    ... on PythonError { message }
    ... on RunNotFoundError { message }
  }
}
"""

# The checks the definitions declare on the assets `all_stages` materializes.
CHECKS_QUERY = """
query Checks($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename
    ... on Repository {
      assetNodes {
        assetKey { path }
        assetChecksOrError {
          __typename
          ... on AssetChecks { checks { name blocking } }
        }
      }
    }
  }
}
"""


@pytest.fixture
def dagster_dev(tiny_root: Path, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(write_instance(tmp_path / "dagster_home")),
        RADHARMONY_DATA_ROOT=str(tiny_root),
        RADHARMONY_OUTPUT_ROOT=str(tmp_path / "output"),
        RADHARMONY_WORKERS="1",
    )
    server = DagsterDev(REPO, env, tmp_path / "dagster-dev.log", free_port())
    try:
        server.wait_until_loaded(LOCATION, timeout=120)
        yield server
    finally:
        server.stop(grace=30)


def _run_events(server: DagsterDev, run_id: str) -> list[dict]:
    events: list[dict] = []
    cursor = None
    for _ in range(50):
        data = server.graphql(RUN_EVENTS, {"runId": run_id, "after": cursor})["logsForRun"]
        assert data["__typename"] == "EventConnection", f"{data}" + server.log_tail()
        events += data["events"]
        cursor = data["cursor"]
        if not data["hasMore"]:
            break
    return events


def _events_tail(events: list[dict], count: int = 25) -> str:
    lines = [f"{e['__typename']}: {e.get('message', '')}"[:400] for e in events[-count:]]
    return "\n--- run events (tail) ---\n" + "\n".join(lines)


def _wait_for_run(server: DagsterDev, client: DagsterGraphQLClient, run_id: str) -> str:
    deadline = time.monotonic() + RUN_TIMEOUT
    status = "UNKNOWN"
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            status = client.get_run_status(run_id).value
        except DagsterGraphQLClientError as error:
            status = f"error: {error}"
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(0.5)
    events = _run_events(server, run_id)
    raise AssertionError(
        f"run {run_id} still {status} after {RUN_TIMEOUT:.0f}s"
        + _events_tail(events)
        + server.log_tail()
    )


def _declared_checks(server: DagsterDev) -> dict[tuple[str, str], bool]:
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY_NAME}
    repo = server.graphql(CHECKS_QUERY, {"selector": selector})["repositoryOrError"]
    assert repo["__typename"] == "Repository", repo
    declared = {}
    for node in repo["assetNodes"]:
        asset = "/".join(node["assetKey"]["path"])
        checks = node["assetChecksOrError"]
        if asset in CHECKED_ASSETS and checks["__typename"] == "AssetChecks":
            for check in checks["checks"]:
                declared[(asset, check["name"])] = check["blocking"]
    return declared


@contextlib.contextmanager
def _browser_page(server: DagsterDev, height: int = 1000):
    """A page of a headless Chromium, 1600 pixels wide, for `server`'s UI."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, timeout=60_000
        )
        try:
            page = browser.new_page(viewport={"width": 1600, "height": height})
            page.set_default_timeout(UI_TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def _lineage_screenshot(server: DagsterDev, out: Path) -> None:
    from playwright.sync_api import Error as PlaywrightError

    # The global lineage graph with every group expanded (the UI keeps that state in the URL;
    # collapsed, it shows only group boxes).
    expanded = ",".join(f"global@global:{group}" for group in sorted(set(ASSET_GROUPS.values())))
    url = f"{server.base_url}/asset-groups?expanded={quote(expanded)}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with _browser_page(server, height=1500) as page:
        page.goto(url, wait_until="domcontentloaded")
        graph = page.locator("svg foreignObject")
        missing = []
        try:
            for asset, group in ASSET_GROUPS.items():
                expected = 2 if asset == group else 1
                nodes = graph.get_by_text(asset, exact=True)
                nodes.nth(expected - 1).wait_for(state="visible")
        except PlaywrightError as error:
            missing.append(f"{asset}: {error.message.splitlines()[0]}")
        page.wait_for_timeout(1500)  # let the edges and status badges settle
        page.screenshot(path=str(out), full_page=True)
        assert not missing, (
            f"lineage graph at {url} lacks {missing}; page text:\n"
            + page.inner_text("body")[:2000]
            + server.log_tail()
        )


def test_ui_runs_a_partition_and_shows_the_lineage(dagster_dev: DagsterDev):
    server = dagster_dev
    client = DagsterGraphQLClient("127.0.0.1", port_number=server.port, timeout=60)

    # A partitioned run is launched like the launchpad does: the `dagster/partition` tag.
    run_id = client.submit_job_execution(
        ALL_STAGES_JOB,
        repository_location_name=LOCATION,
        repository_name=REPOSITORY_NAME,
        tags={"dagster/partition": PARTITION},
    )
    status = _wait_for_run(server, client, run_id)
    events = _run_events(server, run_id)
    assert status == "SUCCESS", f"run {run_id}: {status}" + _events_tail(events) + server.log_tail()

    materialized = {
        ("/".join(e["assetKey"]["path"]), e["partition"])
        for e in events
        if e["__typename"] == "MaterializationEvent"
    }
    assert {(asset, PARTITION) for asset in CHECKED_ASSETS} <= materialized, materialized

    evaluations = {
        ("/".join(e["evaluation"]["assetKey"]["path"]), e["evaluation"]["checkName"]): e[
            "evaluation"
        ]
        for e in events
        if e["__typename"] == "AssetCheckEvaluationEvent"
    }
    declared = _declared_checks(server)
    assert {asset for asset, _ in declared} >= {"raw_index", "labels", "masks", "bboxes"}
    assert set(declared) <= set(evaluations), (
        f"checks not evaluated: {sorted(set(declared) - set(evaluations))}"
    )
    failed = [
        f"{asset}:{name}"
        for (asset, name), blocking in declared.items()
        if blocking and not evaluations[(asset, name)]["success"]
    ]
    assert not failed, f"blocking checks failed: {failed}" + _events_tail(events)

    artifact = REPO / "test-artifacts" / "ui-lineage.png"
    _lineage_screenshot(server, artifact)
    assert artifact.stat().st_size > 10_000
    if os.environ.get("RADHARMONY_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(artifact, REPO / "docs" / "ui-screenshot.png")


# --- A freshly built demo instance, as a new user sees it after `make demo` and `make ui` ---

CHANGED_PARTITION = "chestx_det.train"
CHANGED_FILE = "ChestX_Det_train.json"
DOCUMENTED_EXCEPTION = "chexlocalize/patient65086_study1_view1_frontal"

SENSOR_STATE = """
query Sensor($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { id selectorId status } }
  }
}
"""
STOP_SENSOR = """
mutation Stop($originId: String, $selectorId: String) {
  stopSensor(jobOriginId: $originId, jobSelectorId: $selectorId) {
    __typename
    ... on StopSensorMutationResult { instigationState { status } }
    ... on PythonError { message }
  }
}
"""
RUNS = """
query Runs($filter: RunsFilter) {
  runsOrError(filter: $filter) {
    __typename
    ... on Runs {
      results {
        runId jobName status
        tags { key value }
        repositoryOrigin { repositoryLocationName repositoryName }
      }
    }
  }
}
"""
CHECK_EXECUTIONS = """
query Checks($assetKey: AssetKeyInput!, $checkName: String!) {
  assetCheckExecutions(assetKey: $assetKey, checkName: $checkName, limit: 50) {
    status
    evaluation { partition success description }
  }
}
"""
OBSERVATIONS = """
query Observations($assetKey: AssetKeyInput!, $partition: String!) {
  assetOrError(assetKey: $assetKey) {
    __typename
    ... on Asset {
      assetObservations(partitions: [$partition], limit: 1) {
        runId partition
        metadataEntries {
          label
          ... on TextMetadataEntry { text }
          ... on JsonMetadataEntry { jsonString }
          ... on IntMetadataEntry { intValue }
        }
      }
    }
  }
}
"""
COLUMN_SCHEMA = """
query Schema($assetKey: AssetKeyInput!) {
  assetOrError(assetKey: $assetKey) {
    ... on Asset {
      assetMaterializations(limit: 1) {
        metadataEntries {
          label
          ... on TableSchemaMetadataEntry { schema { columns { name description } } }
        }
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def demo_server(tiny_demo):
    """`dagster dev` on the session's freshly built demo instance (`radharmony demo` on a
    private copy of the tiny datasets, see conftest.py)."""
    server = DagsterDev(
        REPO, tiny_demo.environment, tiny_demo.base / "dagster-dev.log", free_port()
    )
    try:
        server.wait_until_loaded(LOCATION, timeout=120)
        server.data_root = tiny_demo.data_root
        yield server
    finally:
        server.stop(grace=30)


def _open(page, server: DagsterDev, path: str, *texts: str) -> str:
    """Open a UI page and wait until every text is visible on it; returns the page's text."""
    page.goto(server.base_url + path, wait_until="domcontentloaded")
    for text in texts:
        try:
            page.get_by_text(text, exact=False).first.wait_for(state="visible")
        except Exception as error:  # the page's text says more than the timeout
            raise AssertionError(
                f"{path}: {text!r} not shown ({error}); page text:\n"
                + page.inner_text("body")[:3000]
                + server.log_tail()
            ) from error
    return page.inner_text("body")


def _shot(page, name: str) -> Path:
    out = REPO / "test-artifacts" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(out), full_page=False)
    if os.environ.get("RADHARMONY_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(out, REPO / "docs" / name)
    return out


def _metadata(entries: list[dict]) -> dict[str, object]:
    values = {}
    for entry in entries:
        if "jsonString" in entry:
            values[entry["label"]] = json.loads(entry["jsonString"])
        else:
            values[entry["label"]] = entry.get("text", entry.get("intValue"))
    return values


def test_demo_runs_show_under_the_project_job(demo_server: DagsterDev):
    server = demo_server
    runs = server.graphql(RUNS, {"filter": {"pipelineName": ALL_STAGES_JOB}})["runsOrError"]
    assert runs["__typename"] == "Runs", runs
    partitions = set()
    for run in runs["results"]:
        assert run["status"] == "SUCCESS", run
        assert run["repositoryOrigin"] == {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY_NAME,
        }, "a run without its code location is left off the Overview timeline and job page"
        partitions |= {t["value"] for t in run["tags"] if t["key"] == "dagster/partition"}
    assert len(partitions) == 10, partitions

    with _browser_page(server) as page:
        text = _open(page, server, "/runs", ALL_STAGES_JOB, f"partition: {CHANGED_PARTITION}")
        assert "__ASSET_JOB" not in text
        _open(page, server, f"/locations/{LOCATION}/jobs/{ALL_STAGES_JOB}/runs", "rexgradient.val")
        _open(
            page, server, "/overview/timeline", ALL_STAGES_JOB, "manifest", "observe_source_files"
        )
        assert "No runs or scheduled ticks" not in page.inner_text("body")
        _shot(page, "ui-timeline.png")


def test_documented_exception_passes_and_is_named(demo_server: DagsterDev):
    server = demo_server
    executions = server.graphql(
        CHECK_EXECUTIONS,
        {"assetKey": {"path": ["masks"]}, "checkName": "positives_without_masks"},
    )["assetCheckExecutions"]
    by_partition = {e["evaluation"]["partition"]: e for e in executions if e["evaluation"]}
    documented = by_partition["chexlocalize.test"]
    assert documented["status"] == "SUCCEEDED", documented
    assert DOCUMENTED_EXCEPTION in documented["evaluation"]["description"]

    with _browser_page(server) as page:
        path = "/assets/masks?view=checks&checkDetail=positives_without_masks"
        _open(page, server, path, "positives_without_masks")
        page.get_by_text("Execution history", exact=True).first.click()
        row = page.locator("tr", has_text="chexlocalize.test").first
        row.wait_for(state="visible")
        assert "Passed" in row.inner_text() or "Succeeded" in row.inner_text(), row.inner_text()


def test_manifest_column_lineage_renders(demo_server: DagsterDev):
    server = demo_server
    with _browser_page(server) as page:
        _open(page, server, "/assets/unified_manifest", "column_lineage")
        page.locator("tr", has_text="column_lineage").get_by_text("Show Markdown").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("manifest column").wait_for(state="visible")
        lineage = dialog.inner_text()
        assert "label_cardiomegaly" in lineage and "labels" in lineage, lineage
        assert "bboxes_resized" in lineage and "raw_index" in lineage, lineage
        _shot(page, "ui-column-lineage.png")


def test_column_descriptions_show_on_the_schema(demo_server: DagsterDev):
    server = demo_server
    # Every column's description (published in `dagster/column_schema`) is on the schema table.
    materialization = server.graphql(COLUMN_SCHEMA, {"assetKey": {"path": ["raw_index"]}})[
        "assetOrError"
    ]["assetMaterializations"][0]
    schema = next(
        e["schema"]
        for e in materialization["metadataEntries"]
        if e["label"] == "dagster/column_schema"
    )
    description = {c["name"]: c["description"] for c in schema["columns"]}["image_id"]
    assert description, "raw_index.image_id has no description in its published schema"
    with _browser_page(server) as page:
        _open(page, server, "/assets/raw_index", "Columns")
        # The UI renders descriptions as Markdown: `code` spans lose their backticks.
        shown = description.replace("`", "").split(".")[0][:40]
        # The row's name can render before its description cell: wait for both in one row.
        row = page.locator("tr", has_text="image_id").filter(has_text=shown).first
        try:
            row.wait_for(state="visible", timeout=15_000)
        except Exception as error:  # playwright's TimeoutError: show what the row holds
            shown_row = page.locator("tr", has_text="image_id").first.inner_text()
            raise AssertionError(f"{shown!r} not in the image_id row: {shown_row!r}") from error


def test_a_changed_annotation_file_marks_its_partition(demo_server: DagsterDev):
    server = demo_server
    # Keep the rebuild sensor from rebuilding the partition while the test looks at it.
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY_NAME,
        "sensorName": "rebuild_changed_partitions",
    }
    state = server.graphql(SENSOR_STATE, {"selector": selector})["sensorOrError"]["sensorState"]
    stopped = server.graphql(
        STOP_SENSOR, {"originId": state["id"], "selectorId": state["selectorId"]}
    )["stopSensor"]
    assert stopped["__typename"] == "StopSensorMutationResult", stopped

    path = server.data_root / "chestx-det" / CHANGED_FILE
    path.write_text(json.dumps(json.loads(path.read_text()), indent=1))
    client = DagsterGraphQLClient("127.0.0.1", port_number=server.port, timeout=60)
    run_id = client.submit_job_execution(
        "observe_source_files", repository_location_name=LOCATION, repository_name=REPOSITORY_NAME
    )
    assert _wait_for_run(server, client, run_id) == "SUCCESS", server.log_tail()

    observed = {}
    for partition in (CHANGED_PARTITION, "chestx_det.test"):
        asset = server.graphql(
            OBSERVATIONS, {"assetKey": {"path": ["source_files"]}, "partition": partition}
        )["assetOrError"]
        (latest,) = asset["assetObservations"]
        assert latest["runId"] == run_id
        observed[partition] = _metadata(latest["metadataEntries"])
    changed = observed[CHANGED_PARTITION]
    assert changed["annotation_files_changed"]["modified"] == [CHANGED_FILE], changed
    assert CHANGED_FILE in changed["changes"] and changed["images"] > 0
    assert observed["chestx_det.test"]["changes"] == "unchanged since the previous observation"

    with _browser_page(server) as page:
        # The changed partition's stages read "Unsynced"; an unchanged partition does not.
        _open(page, server, f"/assets/raw_index?view=partitions&partition={CHANGED_PARTITION}")
        page.get_by_text("Unsynced", exact=False).first.wait_for(state="visible")
        _shot(page, "ui-changed-partition.png")
        _open(page, server, "/assets/raw_index?view=partitions&partition=chestx_det.test")
        page.get_by_text("Latest materialization").first.wait_for(state="visible")
        page.wait_for_timeout(2000)
        assert "Unsynced" not in page.inner_text("body")
        # The observation itself, with what changed, on the source's events page.
        text = _open(
            page,
            server,
            f"/assets/source_files?view=events&partition={CHANGED_PARTITION}",
            "annotation file(s) modified",
        )
        assert CHANGED_FILE in text
        _shot(page, "ui-observation.png")
