"""Reading radiology report text into the unified observations (CheXpert-style rule labels)."""
