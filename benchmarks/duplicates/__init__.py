"""The parts of bench_duplicates.py too long to sit in it: the planted inputs of its searches
(planted.py) and the sections behind the hash and threshold choices (choices.py)."""
