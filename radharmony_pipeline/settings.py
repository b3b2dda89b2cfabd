"""Every setting: each one's variable, default, bounds and parser, written once here; the
variables of one dataset's location are declared in its module under sources/ and listed here
(`every_variable`).

Parsers take the environment as a value (defs/run_settings.py hands them this process's), so a bad
value (RADHARMONY_IMAGE_SIZE=0, RADHARMONY_WORKERS=two) stops the run before any work with a
message naming the variable, instead of turning every row into an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

# Where the downloads are (each dataset's own variable overrides it for that dataset).
DATA_ROOT_VARIABLE = "RADHARMONY_DATA_ROOT"
# The demo's synthetic datasets, the data root when none is set.
DEFAULT_DATA_ROOT = "data/demo"
OUTPUT_ROOT_VARIABLE = "RADHARMONY_OUTPUT_ROOT"
# The output roots when none is set: the demo's datasets' and any other data's, so a run on real
# downloads never overwrites or joins the demo's tables.
DEMO_OUTPUT_ROOT = "data/output"
REAL_OUTPUT_ROOT = "data/output-real"
# When the schedule fingerprints the downloads (cron); nightly at 02:00 by default.
OBSERVE_CRON_VARIABLE = "RADHARMONY_OBSERVE_CRON"
DEFAULT_OBSERVE_CRON = "0 2 * * *"
IMAGE_SIZE_VARIABLE = "RADHARMONY_IMAGE_SIZE"
DEFAULT_IMAGE_SIZE = 224
# Larger outputs than the largest radiographs make no sense and would allocate N x S x S bytes.
MAX_IMAGE_SIZE = 8192
WORKERS_VARIABLE = "RADHARMONY_WORKERS"
TIMEOUT_VARIABLE = "RADHARMONY_JOB_TIMEOUT"
# Far above any sound image's time; only a stuck decoder or a hostile file reaches it.
DEFAULT_TIMEOUT_SECONDS = 300.0
SCHEDULER_VARIABLE = "RADHARMONY_DASK_SCHEDULER"
STRICT_VARIABLE = "RADHARMONY_STRICT"
UNREADABLE_LIMIT_VARIABLE = "RADHARMONY_UNREADABLE_LIMIT"
# Above this share of a partition's images unreadable for one reason, its step fails.
DEFAULT_UNREADABLE_LIMIT = 0.5
PARENT_LEAKS_VARIABLE = "RADHARMONY_PARENT_LEAKS"
PARENT_LEAK_MODES = ("warn", "block")
DEFAULT_PARENT_LEAKS = "warn"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class ConfigurationError(ValueError):
    """A setting has a value the pipeline cannot use; the message names the variable."""


def image_size(environ: Mapping[str, str]) -> int:
    """RADHARMONY_IMAGE_SIZE: the output side in pixels, 1..MAX_IMAGE_SIZE (default 224)."""
    raw = environ.get(IMAGE_SIZE_VARIABLE)
    if raw is None or not raw.strip():
        return DEFAULT_IMAGE_SIZE
    try:
        size = int(raw.strip())
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_IMAGE_SIZE:
        raise ConfigurationError(
            f"{IMAGE_SIZE_VARIABLE} must be a whole number of pixels from 1 to "
            f"{MAX_IMAGE_SIZE}, got {raw!r}"
        )
    return size


def worker_count(environ: Mapping[str, str]) -> int:
    """RADHARMONY_WORKERS if set (a positive integer), else the machine's CPU count."""
    raw = environ.get(WORKERS_VARIABLE)
    if raw is None:
        return os.cpu_count() or 1
    try:
        workers = int(raw.strip())
    except ValueError:
        workers = 0
    if workers < 1:
        raise ConfigurationError(f"{WORKERS_VARIABLE} must be a positive integer, got {raw!r}")
    return workers


def job_timeout(environ: Mapping[str, str]) -> float:
    """RADHARMONY_JOB_TIMEOUT (seconds per image, a positive number), else the default."""
    raw = environ.get(TIMEOUT_VARIABLE)
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigurationError(
            f"{TIMEOUT_VARIABLE} must be a positive number of seconds per image, got {raw!r}"
        )
    return seconds


def dask_scheduler(environ: Mapping[str, str]) -> str | None:
    """RADHARMONY_DASK_SCHEDULER: a scheduler address (`tcp://host:8786`), or None for the
    local process pool."""
    address = (environ.get(SCHEDULER_VARIABLE) or "").strip()
    return address or None


def strict_mode(environ: Mapping[str, str]) -> bool:
    """RADHARMONY_STRICT: 1/true fails a step on its first error row; 0/false/unset does not."""
    raw = (environ.get(STRICT_VARIABLE) or "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigurationError(f"{STRICT_VARIABLE} must be 1 or 0 (true or false), got {raw!r}")


def unreadable_limit(environ: Mapping[str, str]) -> float:
    """RADHARMONY_UNREADABLE_LIMIT: the share (0 to 1) of a partition's images that may be
    missing or unreadable for one reason before its step fails (default 0.5; 1 never fails).
    Below it, each bad image is an error row and the rest is built."""
    raw = (environ.get(UNREADABLE_LIMIT_VARIABLE) or "").strip()
    if not raw:
        return DEFAULT_UNREADABLE_LIMIT
    try:
        limit = float(raw)
    except ValueError:
        limit = -1.0
    if not 0.0 <= limit <= 1.0:
        raise ConfigurationError(
            f"{UNREADABLE_LIMIT_VARIABLE} must be a share from 0 to 1 (e.g. 0.5), got {raw!r}"
        )
    return limit


def parent_leaks(environ: Mapping[str, str]) -> str:
    """RADHARMONY_PARENT_LEAKS: `block` makes leaks against the parents' splits fail their
    checks as errors (the manifest waits); `warn` (the default) only warns."""
    raw = (environ.get(PARENT_LEAKS_VARIABLE) or DEFAULT_PARENT_LEAKS).strip().lower()
    if raw not in PARENT_LEAK_MODES:
        raise ConfigurationError(f"{PARENT_LEAKS_VARIABLE} must be warn or block, got {raw!r}")
    return raw


_PARSERS: dict[str, Callable[[Mapping[str, str]], object]] = {
    IMAGE_SIZE_VARIABLE: image_size,
    WORKERS_VARIABLE: worker_count,
    TIMEOUT_VARIABLE: job_timeout,
    SCHEDULER_VARIABLE: dask_scheduler,
    STRICT_VARIABLE: strict_mode,
    UNREADABLE_LIMIT_VARIABLE: unreadable_limit,
    PARENT_LEAKS_VARIABLE: parent_leaks,
}


def observe_cron(environ: Mapping[str, str]) -> str:
    """RADHARMONY_OBSERVE_CRON: the observation schedule's cron, else nightly at 02:00."""
    return (environ.get(OBSERVE_CRON_VARIABLE) or "").strip() or DEFAULT_OBSERVE_CRON


def every_variable() -> list[str]:
    """Every `RADHARMONY_*` variable the pipeline reads: the ones above, and each dataset's
    location variables as its module under sources/ declares them (`env_vars`)."""
    # sources/ reads the data root's variable from this module: its declarations are imported
    # when they are asked for, not when this module loads.
    from .sources import SOURCE_TYPES
    from .sources.nih_chestxray14 import ENV_VAR as NIH_ROOT_VARIABLE

    own = [DATA_ROOT_VARIABLE, OUTPUT_ROOT_VARIABLE, OBSERVE_CRON_VARIABLE, *_PARSERS]
    datasets = [v for source in SOURCE_TYPES.values() for v in source.env_vars.values()]
    return [*own, *datasets, NIH_ROOT_VARIABLE]


def validate_settings(environ: Mapping[str, str]) -> None:
    """Check every setting; the first bad one raises ConfigurationError naming its variable."""
    for parse in _PARSERS.values():
        parse(environ)
