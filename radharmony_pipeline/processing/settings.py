"""The RADHARMONY_* settings that tune processing, each validated once with a message naming it.

A bad value (RADHARMONY_IMAGE_SIZE=0, RADHARMONY_WORKERS=two) must stop the run before any
work, not turn every row into an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from .parallel import WORKERS_VARIABLE, worker_count
from .supervised import TIMEOUT_VARIABLE, job_timeout

IMAGE_SIZE_VARIABLE = "RADHARMONY_IMAGE_SIZE"
STRICT_VARIABLE = "RADHARMONY_STRICT"
UNREADABLE_LIMIT_VARIABLE = "RADHARMONY_UNREADABLE_LIMIT"
# Above this share of a partition's images unreadable for one reason, its step fails.
DEFAULT_UNREADABLE_LIMIT = 0.5
PARENT_LEAKS_VARIABLE = "RADHARMONY_PARENT_LEAKS"
PARENT_LEAK_MODES = ("warn", "block")
DEFAULT_IMAGE_SIZE = 224
# Larger outputs than the largest radiographs make no sense and would allocate N x S x S bytes.
MAX_IMAGE_SIZE = 8192
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class ConfigurationError(ValueError):
    """A setting has a value the pipeline cannot use; the message names the variable."""


def image_size(environ: Mapping[str, str] = os.environ) -> int:
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


def strict_mode(environ: Mapping[str, str] = os.environ) -> bool:
    """RADHARMONY_STRICT: 1/true fails a step on its first error row; 0/false/unset does not."""
    raw = (environ.get(STRICT_VARIABLE) or "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigurationError(f"{STRICT_VARIABLE} must be 1 or 0 (true or false), got {raw!r}")


def unreadable_limit(environ: Mapping[str, str] = os.environ) -> float:
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


def parent_leaks_block(environ: Mapping[str, str] = os.environ) -> bool:
    """RADHARMONY_PARENT_LEAKS: `block` makes leaks against the parents' splits fail their
    checks as errors (the manifest waits); `warn` (the default) only warns."""
    raw = (environ.get(PARENT_LEAKS_VARIABLE) or "warn").strip().lower()
    if raw not in PARENT_LEAK_MODES:
        raise ConfigurationError(f"{PARENT_LEAKS_VARIABLE} must be warn or block, got {raw!r}")
    return raw == "block"


_VALIDATORS: dict[str, Callable[[Mapping[str, str]], object]] = {
    IMAGE_SIZE_VARIABLE: image_size,
    WORKERS_VARIABLE: worker_count,
    TIMEOUT_VARIABLE: job_timeout,
    STRICT_VARIABLE: strict_mode,
    UNREADABLE_LIMIT_VARIABLE: unreadable_limit,
    PARENT_LEAKS_VARIABLE: parent_leaks_block,
}


def validate_settings(environ: Mapping[str, str] = os.environ) -> None:
    """Check every setting; the first bad one raises ConfigurationError naming its variable."""
    for validate in _VALIDATORS.values():
        try:
            validate(environ)
        except ConfigurationError:
            raise
        except ValueError as error:
            raise ConfigurationError(str(error)) from error
