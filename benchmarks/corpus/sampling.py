"""One step of a rehearsal run as its own command and what it cost: wall, the machine's busy
CPU, peak RSS, bytes added, disk reads and pages reclaimed (bench_corpus.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from commands import launch_summary
from common import REPOSITORY as REPO

if TYPE_CHECKING:
    from corpus.cluster import ClusterPath


@dataclass
class Step:
    name: str
    wall: float
    cpu: float
    peak_rss_mb: float
    added_bytes: int
    ok: bool
    # A launched job's stages (Dagster step keys) and their seconds, from the instance.
    stages: dict[str, float] = field(default_factory=dict)
    # Reads the disk under the output root completed while the step ran (all processes).
    disk_reads: int = 0
    # Pages the kernel reclaimed while the step ran (all processes): what writing more than
    # the free memory holds costs.
    pages_reclaimed: int = 0
    # On the cluster path: the S3 server's requests by kind (its 5xx answers and bytes in and
    # out among them) and the peak RSS of each kind of service process while the step ran.
    requests: dict[str, int] = field(default_factory=dict)
    service_peaks_mb: dict[str, float] = field(default_factory=dict)


def run_step(
    name: str,
    command: list[str],
    env: dict,
    output: Path,
    log: Path,
    cluster: ClusterPath | None = None,
) -> Step:
    """`command` run once under /usr/bin/time and what it cost; on the `cluster` path, with
    the S3 server's requests and the services' peak RSS while it ran."""
    before = _tree_bytes(output)
    stats = log.with_suffix(".time")
    if cluster is not None:
        cluster.reset_peaks()
        requests = cluster.requests()
    busy, reads, reclaimed = machine_busy_seconds(), disk_reads(output), pages_reclaimed()
    start = time.perf_counter()
    with log.open("ab") as sink:
        sink.write(f"\n=== {name}: {' '.join(command)}\n".encode())
        sink.flush()
        code = subprocess.call(
            ["/usr/bin/time", "-o", str(stats), "-f", "%M", *command],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    wall = time.perf_counter() - start
    cpu = machine_busy_seconds() - busy
    rss_kb = stats.read_text().split()[-1]
    step = Step(
        name,
        wall,
        cpu,
        int(rss_kb) / 1024,
        _tree_bytes(output) - before,
        code == 0,
        disk_reads=disk_reads(output) - reads,
        pages_reclaimed=pages_reclaimed() - reclaimed,
    )
    if cluster is not None:
        step.requests = dict(cluster.requests() - requests)
        step.service_peaks_mb = cluster.peaks_mb()
    return step


def machine_busy_seconds() -> float:
    """CPU seconds every core has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def disk_reads(folder: Path) -> int:
    """Reads completed since boot by the block device holding `folder` (its nearest existing
    folder), 0 where the kernel keeps no such count (a virtual file system): a cold step's
    wall is its reads (the code's part) times their latency (the disk's part)."""
    while not folder.exists():
        folder = folder.parent
    device = os.stat(folder).st_dev
    counts = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat")
    return int(counts.read_text().split()[0]) if counts.exists() else 0


# The kernel's reclaimers, each counted in /proc/vmstat as pgsteal_<reclaimer>.
RECLAIMERS = ("kswapd", "direct", "khugepaged", "proactive")


def pages_reclaimed() -> int:
    """Pages the kernel has reclaimed since boot, by every reclaimer: kswapd's reclaim costs
    CPU beside the step, direct reclaim stalls it."""
    counts = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    return sum(int(counts.get(f"pgsteal_{reclaimer}", 0)) for reclaimer in RECLAIMERS)


def _tree_bytes(folder: Path) -> int:
    if not folder.exists():
        return 0
    done = subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=False)
    return int(done.stdout.split()[0]) if done.stdout else 0


def counted(step: Step, env: dict) -> Step:
    """The step with its stages' seconds, after printing its line and what its images stage
    decoded and wrote."""
    print(f"  {_row(step)}", flush=True)
    launched = launch_summary(env)
    step.stages = launched["steps"]
    print(f"    stages: {json.dumps(step.stages)}", flush=True)
    print(f"    images: {json.dumps(launched['counts'].get('images', {}))}", flush=True)
    return step


STEP_NAME_WIDTH = 34  # the step column of the printed lines


def _row(step: Step) -> str:
    flag = "" if step.ok else "  FAILED (see steps_n<size>.log)"
    return (
        f"{step.name:<{STEP_NAME_WIDTH}} wall {step.wall:8.1f} s  cpu {step.cpu:8.1f} s  "
        f"peak {step.peak_rss_mb:7.0f} MB  +{step.added_bytes / 1e9:6.2f} GB  "
        f"reads {step.disk_reads / 1e3:7.0f} K ({step.disk_reads / step.wall / 1e3:5.1f} K/s)  "
        f"reclaimed {step.pages_reclaimed / 1e3:7.0f} K pages"
        f"{flag}"
    )
