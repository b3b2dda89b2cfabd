"""Keep freed image buffers in the process's heap, so the next image reuses their pages."""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc hands out blocks above its mmap threshold (128 KiB, adapting up to 32 MiB) as fresh
# mappings and returns freed heap above its trim threshold to the system, so each decoded
# radiograph (1-16 MB) lands on pages the kernel must fault in and zero again: about a third
# of an 8-bit PNG's decode time in the `images` workers. Above these sizes the old
# behaviour stays (a rare huge image is still unmapped when freed).
_MMAP_THRESHOLD = 64 << 20
_TRIM_THRESHOLD = 256 << 20
# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_image_buffers() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (and the processes it forks);
    False where the C library is not glibc (nothing changes there)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc, or no C library found
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
