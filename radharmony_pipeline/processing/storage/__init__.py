"""Where bytes live: local and object-store I/O, atomic writes, keys and checksums."""
