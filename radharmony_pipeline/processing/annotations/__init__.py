"""Annotation geometry: RLE and polygon masks, their union, boxes and overlaps."""
