"""The output volume fills up, or turns read-only, under a run: on a small tmpfs the test
mounts itself (as root) and unmounts in `finally`. The step fails with one message naming
the output root, its volume, the bytes needed and the free space; nothing partial is left;
once the volume takes writes again the same command converges to the bytes of a run on an
ordinary disk.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fault_support import build, failure_message, output_files

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.synthetic import generate_datasets

PARTITION = "chestx_det.test"

pytestmark = [
    pytest.mark.build,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]


def mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)


def remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("disk")
    data = base / "data"
    generate_datasets(data, scale="tiny", seed=7, mimic_format="mixed")
    result = build(data, base / "reference", PARTITION)
    assert result.success
    return data, output_files(base / "reference")


@pytest.mark.timeout(600)
def test_a_full_volume_fails_with_one_message_and_resumes_to_the_same_bytes(reference, tmp_path):
    data, expected = reference
    total = sum(len(content) for content in expected.values())
    volume = tmp_path / "volume"
    root = volume / "radharmony" / "output"  # the output root is not the mount point
    mount_tmpfs(volume, f"{total // 3 // 4096 * 4096}")
    try:
        failed = build(data, root, PARTITION)
        assert not failed.success
        message = failure_message(failed)
        assert f"under the output root {root}:" in message
        assert "no space left on the output root's volume" in message
        assert f"mounted at {volume})" in message
        assert "bytes needed" in message and "bytes free" in message
        assert "run the same command again" in message
        # Nothing partial: no temporary file, and every file there is complete.
        left = output_files(root)
        assert not [name for name in left if TEMP_MARKER in name]
        assert all(expected[name] == content for name, content in left.items())

        remount(volume, "size=64m")
        resumed = build(data, root, PARTITION)
        assert resumed.success
        assert output_files(root) == expected
    finally:
        unmount(volume)


@pytest.mark.timeout(600)
def test_a_volume_turned_read_only_mid_run_fails_clearly_and_resumes(reference, tmp_path):
    data, expected = reference
    volume = tmp_path / "volume"
    root = volume / "output"
    mount_tmpfs(volume, "64m")
    stop = threading.Event()

    def turn_read_only_once_tables_appear() -> None:
        while not stop.is_set():
            if (layout.tables_folder(root) / "labels").exists():
                remount(volume, "ro")
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=turn_read_only_once_tables_appear)
    watcher.start()
    try:
        failed = build(data, root, PARTITION)
        stop.set()
        watcher.join()
        assert not failed.success
        message = failure_message(failed)
        assert f"under the output root {root}:" in message
        assert f"mounted at {volume}) is read-only" in message
        assert "run the same command again" in message
        left = output_files(root)
        assert all(
            expected[name] == content for name, content in left.items() if TEMP_MARKER not in name
        )

        remount(volume, "rw")
        resumed = build(data, root, PARTITION)
        assert resumed.success
        assert output_files(root) == expected
    finally:
        stop.set()
        watcher.join()
        unmount(volume)
