"""A killed `images` materialization resumes to the same bytes and leaves no temporary file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fault_support import output_files
from PIL import Image

from radharmony_pipeline.processing.storage import output_layout as layout

pytestmark = [pytest.mark.build, pytest.mark.slow]  # a run killed mid-way

PARTITION = "rexgradient.train"
# Materializes every partitioned stage of one partition, as `dagster asset materialize` would.
SCRIPT = """
import sys
from radharmony_pipeline.definitions import build_definitions

if __name__ == "__main__":
    data_root, output, partition = sys.argv[1:]
    job = build_definitions(data_root, output).resolve_job_def("all_stages")
    result = job.execute_in_process(partition_key=partition, raise_on_error=False)
    sys.exit(0 if result.success else 1)
"""


def materialize(data_root: Path, output: Path, script: Path) -> subprocess.Popen:
    environ = {**os.environ, "RADHARMONY_WORKERS": "1"}
    return subprocess.Popen(
        [sys.executable, str(script), str(data_root), str(output), PARTITION],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def outputs_of(output: Path) -> dict[str, bytes]:
    """Every image, mask and packed-array file of the partition, by relative path."""
    return output_files(output, output / layout.IMAGES)


def test_killed_run_resumes_byte_identical_without_temporary_files(tiny_copy, tmp_path):
    script = tmp_path / "materialize.py"
    script.write_text(SCRIPT)
    index_path = tiny_copy / "rexgradient"
    clean = tmp_path / "clean"
    assert materialize(tiny_copy, clean, script).wait(timeout=300) == 0
    expected = outputs_of(clean)
    table = pd.read_parquet(layout.table_file(clean, "raw_index", PARTITION))
    assert len(table) >= 4

    # A very large image in the middle keeps the worker busy for seconds: the run is killed
    # while it decodes, after the images before it were written.
    middle = len(table) // 2
    victim = index_path / "deid_png" / table["image_path"].iloc[middle]
    saved = tmp_path / "saved.png"
    shutil.copy2(victim, saved)
    noise = np.random.default_rng(0).integers(0, 65535, (9000, 9000), dtype=np.uint16)
    Image.fromarray(noise).save(victim, compress_level=1)
    before = clean / layout.resized_image(PARTITION, table["image_key"].iloc[middle - 1])
    killed = tmp_path / "killed"
    process = materialize(tiny_copy, killed, script)
    written = killed / before.relative_to(clean)
    deadline = time.monotonic() + 120
    while not written.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert written.exists() and list((killed / layout.IMAGES).glob(".partial-*")), (
        "the run must be killed mid-way"
    )
    assert not (killed / layout.packed_images(PARTITION)).exists()

    victim.unlink()
    shutil.copy2(saved, victim)
    rerun = materialize(tiny_copy, killed, script)
    assert rerun.wait(timeout=300) == 0, rerun.stderr.read()[-3000:]
    assert outputs_of(killed) == expected
    assert not list(killed.rglob(".partial-*"))
    packed = np.load(killed / layout.packed_images(PARTITION))
    assert packed.shape[0] == len(table)
