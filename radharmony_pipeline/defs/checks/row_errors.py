"""What every stage's `*_error_rows` check reports (each runs in its stage's step)."""

ROW_ERRORS_DESCRIPTION = (
    "Rows with status `error` (the reason names the file, the entry and the field), counted "
    "by reason. A warning, so the good rows still flow; blocks downstream in strict mode "
    "(RADHARMONY_STRICT=1)."
)
