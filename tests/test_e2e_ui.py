"""End to end through the UI server: `dagster dev` on tiny data, one partition of `all_stages`
launched over GraphQL, its checks read back over GraphQL, the lineage graph in headless Chromium.

Needs Debian's chromium at /usr/bin/chromium (`.ci/run` installs it) and the `playwright` Python
package (the `dev` extra); no browser is downloaded. Screenshot: test-artifacts/ui-lineage.png,
copied to docs/ui-screenshot.png when RADHARMONY_UPDATE_SCREENSHOT=1.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError
from e2e_support import REPOSITORY_NAME, DagsterDev, free_port, write_instance

from radharmony_pipeline.defs.jobs import ALL_STAGES_JOB

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
    "raw_index": "index",
    "labels": "labels",
    "masks": "masks",
    "bboxes": "bboxes",
    "images": "images",
    "unified_manifest": "manifest",
    "near_duplicates": "manifest",
    "corpus_profile": "manifest",
    "partition_profile": "profile",
}
CHECKED_ASSETS = ("raw_index", "labels", "masks", "bboxes", "images")
RUN_TIMEOUT = 240.0
UI_TIMEOUT_MS = 60_000

# The GraphQL client's gql dependency deprecates the call style the client itself uses.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Using variable_values and operation_name:DeprecationWarning"
)

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
        time.sleep(2.0)
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


def _lineage_screenshot(server: DagsterDev, out: Path) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    # The global lineage graph with every group expanded (the UI keeps that state in the URL;
    # collapsed, it shows only group boxes).
    expanded = ",".join(f"global@global:{group}" for group in sorted(set(ASSET_GROUPS.values())))
    url = f"{server.base_url}/asset-groups?expanded={quote(expanded)}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS, timeout=60_000
        )
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1500})
            page.set_default_timeout(UI_TIMEOUT_MS)
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
        finally:
            browser.close()


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
