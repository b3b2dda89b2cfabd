"""The README's "Your downloads" commands, run verbatim on tiny data laid out as it says."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from commands import run_ok

from radharmony_pipeline.processing.storage import output_layout as layout

REPOSITORY = Path(__file__).resolve().parent.parent
SECTION = "## Your downloads"


def readme_commands() -> str:
    """The section's shell block, exactly as written."""
    text = (REPOSITORY / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the section should hold one bash block to copy"
    return blocks[0]


def folder_names_in_the_tree() -> list[str]:
    text = (REPOSITORY / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    tree = re.findall(r"```text\n(.*?)```", section, flags=re.DOTALL)[0]
    return sorted({line.split()[0].split("/")[0] for line in tree.splitlines()[1:]})


def test_the_section_names_the_folders_the_data_root_holds(tiny_root):
    generated = sorted(p.name for p in tiny_root.iterdir() if p.is_dir())
    assert folder_names_in_the_tree() == generated


@pytest.mark.slow
@pytest.mark.build
def test_the_commands_run_verbatim_on_a_data_root_of_tiny_data(tiny_root, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(tiny_root, home / "cxr-downloads")
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("RADHARMONY_", "DAGSTER_"))
    }
    environment.update(HOME=str(home), RADHARMONY_WORKERS="1")
    completed = run_ok(
        ["bash", "-e", "-c", readme_commands()], cwd=REPOSITORY, env=environment, timeout=1200
    )
    assert "every configured partition is usable" in completed.stdout
    checked = [line for line in completed.stdout.splitlines() if line.startswith("chestx_det.")]
    assert len(checked) == 2 and all(" ok " in line for line in checked)
    # The run went to the output root and the persistent instance the section sets.
    output = home / "radharmony" / "output"
    raw_index = pd.read_parquet(layout.table_file(output, "raw_index", "chestx_det.test"))
    expected = len(list((tiny_root / "chestx-det" / "test").glob("*.png")))
    assert len(raw_index) == expected
    assert layout.table_file(output, "images", "chestx_det.test").exists()
    instance_home = home / "radharmony" / "dagster_home"
    assert (instance_home / "dagster.yaml").exists()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", str(instance_home))
        with dg.DagsterInstance.get() as instance:
            runs = instance.get_runs()
            tags = [run.tags.get("dagster/partition") for run in runs]
            assert [run.job_name for run in runs] == ["all_stages"] and runs[0].is_success
    assert tags == ["chestx_det.test"]
