"""Write files under a temporary name and rename them into place, so no reader sees half a file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEMP_MARKER = ".partial-"


def temporary_sibling(path: Any) -> Any:
    """A unique name in the same folder (same filesystem, so the rename is atomic)."""
    return path.with_name(f"{TEMP_MARKER}{uuid.uuid4().hex}-{path.name}")


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(temp)` and move the result to `path`; on any error remove the temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temporary_sibling(path)
    try:
        write(temp)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
