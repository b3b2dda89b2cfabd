"""Write files under a temporary name and rename them into place, so no reader sees half a file."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil

TEMP_MARKER = ".partial-"
# `.partial-<pid>@<host>-<random>-<name>`: the writer is named so that a clean-up never
# removes a file whose writer is still alive (another run of the same partition, say).
_TEMP_NAME = re.compile(rf"^{re.escape(TEMP_MARKER)}(\d+)@(.*)-[0-9a-f]{{32}}-")
# Names this process gave to files that other processes write (a Dask chunk's shard) and no
# longer waits for: a worker that outlives the failed step may still publish one, and that
# file has no writer left although the process it names is alive.
_RELEASED: set[str] = set()


def temporary_sibling(path: Any) -> Any:
    """A unique name in the same folder (same filesystem, so the rename is atomic), naming
    this process as its writer."""
    owner = f"{os.getpid()}@{socket.gethostname()}"
    return path.with_name(f"{TEMP_MARKER}{owner}-{uuid.uuid4().hex}-{path.name}")


def writer_is_gone(temp: Path) -> bool:
    """Whether the process that named this temporary file can no longer be writing it.

    Names without an owner (written by older versions) count as gone; names from another
    host never do, as that host's processes cannot be checked from here. This process's own
    names are live until it releases them (release_temporaries).
    """
    match = _TEMP_NAME.match(temp.name)
    if match is None:
        return True
    pid, host = int(match.group(1)), match.group(2)
    if host != socket.gethostname():
        return False
    if pid == os.getpid():
        return temp.name in _RELEASED
    return not psutil.pid_exists(pid)


def release_temporaries(temporaries: Iterable[Any]) -> None:
    """Declare that this process no longer waits for these names (see temporary_sibling)
    it handed to other processes: from now on a clean-up may remove them, here too."""
    _RELEASED.update(temp.name for temp in temporaries)


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write(temp)` and move the result to `path`; on any error remove the temp file.

    A missing folder is made when the first write into it fails, not checked before every
    write: the `images` stage writes each of a partition's images into a folder that is there
    after its first. The write is then tried once more even when the folder is there by the
    time this looks: the pool's workers start writing into a new shard folder at the same
    moment, and the one that lost the race to make it must not fail its image. A write that
    fails for another reason (an input it reads is missing) fails again and is raised."""
    temp = temporary_sibling(path)
    try:
        try:
            write(temp)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            write(temp)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
