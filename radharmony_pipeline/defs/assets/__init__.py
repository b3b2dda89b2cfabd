"""One module per stage of the asset graph."""
