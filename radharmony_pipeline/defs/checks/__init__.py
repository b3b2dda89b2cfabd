"""Asset checks: documented counts and Great Expectations suites."""
