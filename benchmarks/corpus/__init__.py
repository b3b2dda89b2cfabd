"""Helpers of bench_corpus.py: the corpus, the cost of a step, the browser timing, the report."""
