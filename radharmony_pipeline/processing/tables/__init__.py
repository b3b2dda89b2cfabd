"""Table contracts, their Great Expectations suites and the error-reason vocabulary."""
