"""The sections of bench_images.py too long to sit in it: every source format against its
floor (formats.py) and the `images` step against its work alone (step.py)."""
