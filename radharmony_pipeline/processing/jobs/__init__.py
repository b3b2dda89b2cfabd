"""Per-image and per-mask work units, as run by the execution layer."""
