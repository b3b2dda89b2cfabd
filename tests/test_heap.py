"""Freed image buffers stay in the heap: the next image of the same size reuses their pages."""

from __future__ import annotations

import os
import subprocess
import sys

# Run in a fresh interpreter: mallopt changes the whole process, and the test process has
# imported decode.py (which sets the thresholds) long before.
_REUSE_PROBE = """
import ctypes
import resource
import sys
import numpy as np
# With transparent huge pages a fresh 16 MiB mapping faults in a handful of 2 MiB pages, so
# the count could not tell a reused buffer from a new one; the probe asks for 4 KiB pages.
PR_SET_THP_DISABLE = 41
assert ctypes.CDLL(None).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
if sys.argv[1] == "keep":
    from radharmony_pipeline.processing.imaging.heap import keep_freed_image_buffers
    assert keep_freed_image_buffers()
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    image = np.empty((2048, 2048, 4), np.uint8)  # 16 MiB, like a decoded RGBA radiograph
    image.fill(1)  # touch every page
    del image
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[1:]))  # the first image maps its pages either way
"""


def _page_faults_after_the_first_image(mode: str, environ: dict[str, str] | None = None) -> int:
    completed = subprocess.run(
        [sys.executable, "-c", _REUSE_PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(environ or {})},
    )
    return int(completed.stdout)


def test_a_freed_image_buffer_is_reused_by_the_next_image() -> None:
    assert _page_faults_after_the_first_image("keep") < 20  # a stray page of Python's own


def test_without_the_setting_every_image_faults_its_pages_in_again() -> None:
    # The test above could pass by luck of the allocator; this shows the probe can tell. glibc
    # raises its mmap threshold by itself after the first large free when the probe's heap is
    # otherwise empty (a worker's is not), so its starting threshold is pinned here.
    pinned = {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    assert _page_faults_after_the_first_image("default", pinned) > 100
