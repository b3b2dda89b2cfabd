"""Whole-corpus work: duplicates, parent datasets, exports, the dataset card, plots."""
