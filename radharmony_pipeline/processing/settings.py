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
