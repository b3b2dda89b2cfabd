"""Every setting: each one's variable, default, bounds and parser, written once here; the
variables of one dataset's location are declared in its module under sources/.

Parsers take the environment as a value (defs/run_settings.py hands them this process's), so a bad
value (RADHARMONY_IMAGE_SIZE=0, RADHARMONY_WORKERS=two) stops the run before any work with a
message naming the variable, instead of turning every row into an error. Each setting is one
call of the parser of its kind (a number within bounds, a choice, an address, a cron schedule);
an unset or blank variable means the setting's default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from croniter import croniter

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
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
T = TypeVar("T")


class ConfigurationError(ValueError):
    """A setting has a value the pipeline cannot use; the message names the variable."""


# --- the parsers, one per kind of setting -------------------------------------------------------


def _given(environ: Mapping[str, str], variable: str) -> str | None:
    """The variable's value as given, or None when it is unset or blank (the default)."""
    raw = environ.get(variable)
    return raw if raw is not None and raw.strip() else None


def _number(
    environ: Mapping[str, str],
    variable: str,
    default: T,
    kind: Callable[[str], T],
    accept: Callable[[T], bool],
    requirement: str,
) -> T:
    """A number of `kind` (int or float) that `accept`s, else ConfigurationError saying it
    `must be {requirement}`."""
    raw = _given(environ, variable)
    if raw is None:
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        value = None
    if value is None or not accept(value):
        raise ConfigurationError(f"{variable} must be {requirement}, got {raw!r}")
    return value


def _choice(
    environ: Mapping[str, str],
    variable: str,
    default: T,
    choices: Mapping[str, T],
    requirement: str,
) -> T:
    """The value of one of `choices` (named in any case), else ConfigurationError."""
    raw = _given(environ, variable)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word not in choices:
        raise ConfigurationError(f"{variable} must be {requirement}, got {word!r}")
    return choices[word]


def _address(environ: Mapping[str, str], variable: str, default: str | None) -> str | None:
    """A path or URL, surrounding blanks removed."""
    raw = _given(environ, variable)
    return default if raw is None else raw.strip()


def _cron_problem(schedule: str) -> str | None:
    """What is wrong with a cron schedule of five fields (the kind Dagster's schedules take,
    or an alias such as `@daily`), or None; croniter reads the fields."""
    fields = schedule.split()
    if not schedule.startswith("@") and len(fields) != 5:
        return f"it has {len(fields)} field(s), not 5"
    if not croniter.is_valid(schedule):
        return "croniter cannot read it"
    return None


def _cron(environ: Mapping[str, str], variable: str, default: str) -> str:
    raw = _given(environ, variable)
    if raw is None:
        return default
    problem = _cron_problem(raw.strip())
    if problem is not None:
        raise ConfigurationError(
            f"{variable} must be a cron schedule of five fields (minute hour day-of-month "
            f"month day-of-week, e.g. {DEFAULT_OBSERVE_CRON!r}), got {raw!r}: {problem}"
        )
    return raw.strip()


# --- the settings --------------------------------------------------------------------------------


def image_size(environ: Mapping[str, str]) -> int:
    """RADHARMONY_IMAGE_SIZE: the output side in pixels, 1..MAX_IMAGE_SIZE (default 224)."""
    return _number(
        environ,
        IMAGE_SIZE_VARIABLE,
        DEFAULT_IMAGE_SIZE,
        int,
        lambda n: 1 <= n <= MAX_IMAGE_SIZE,
        f"a whole number of pixels from 1 to {MAX_IMAGE_SIZE}",
    )


def worker_count(environ: Mapping[str, str]) -> int:
    """RADHARMONY_WORKERS if set (a positive integer), else the machine's CPU count."""
    return _number(
        environ,
        WORKERS_VARIABLE,
        os.cpu_count() or 1,
        int,
        lambda n: n >= 1,
        "a positive integer",
    )


def job_timeout(environ: Mapping[str, str]) -> float:
    """RADHARMONY_JOB_TIMEOUT (seconds per image, a positive number), else the default."""
    return _number(
        environ,
        TIMEOUT_VARIABLE,
        DEFAULT_TIMEOUT_SECONDS,
        float,
        lambda s: 0 < s < math.inf,
        "a positive number of seconds per image",
    )


def dask_scheduler(environ: Mapping[str, str]) -> str | None:
    """RADHARMONY_DASK_SCHEDULER: a scheduler address (`tcp://host:8786`), or None for the
    local process pool."""
    return _address(environ, SCHEDULER_VARIABLE, None)


def strict_mode(environ: Mapping[str, str]) -> bool:
    """RADHARMONY_STRICT: 1/true fails a step on its first error row; 0/false/unset does not."""
    choices = {**dict.fromkeys(_TRUE, True), **dict.fromkeys(_FALSE, False)}
    return _choice(environ, STRICT_VARIABLE, False, choices, "1 or 0 (true or false)")


def unreadable_limit(environ: Mapping[str, str]) -> float:
    """RADHARMONY_UNREADABLE_LIMIT: the share (0 to 1) of a partition's images that may be
    missing or unreadable for one reason before its step fails (default 0.5; 1 never fails).
    Below it, each bad image is an error row and the rest is built."""
    return _number(
        environ,
        UNREADABLE_LIMIT_VARIABLE,
        DEFAULT_UNREADABLE_LIMIT,
        float,
        lambda share: 0.0 <= share <= 1.0,
        "a share from 0 to 1 (e.g. 0.5)",
    )


def parent_leaks(environ: Mapping[str, str]) -> str:
    """RADHARMONY_PARENT_LEAKS: `block` makes leaks against the parents' splits fail their
    checks as errors (the manifest waits); `warn` (the default) only warns."""
    modes = {mode: mode for mode in PARENT_LEAK_MODES}
    return _choice(environ, PARENT_LEAKS_VARIABLE, DEFAULT_PARENT_LEAKS, modes, "warn or block")


def observe_cron(environ: Mapping[str, str]) -> str:
    """RADHARMONY_OBSERVE_CRON: the observation schedule's cron, else nightly at 02:00."""
    return _cron(environ, OBSERVE_CRON_VARIABLE, DEFAULT_OBSERVE_CRON)


# Every setting this module parses, by variable (the data and output roots are paths, read
# where they are used: sources/location.py, defs/resources.py).
PARSERS: dict[str, Callable[[Mapping[str, str]], object]] = {
    IMAGE_SIZE_VARIABLE: image_size,
    WORKERS_VARIABLE: worker_count,
    TIMEOUT_VARIABLE: job_timeout,
    SCHEDULER_VARIABLE: dask_scheduler,
    STRICT_VARIABLE: strict_mode,
    UNREADABLE_LIMIT_VARIABLE: unreadable_limit,
    PARENT_LEAKS_VARIABLE: parent_leaks,
    OBSERVE_CRON_VARIABLE: observe_cron,
}


def validate_settings(environ: Mapping[str, str]) -> None:
    """Check every setting; the first bad one raises ConfigurationError naming its variable."""
    for parse in PARSERS.values():
        parse(environ)
