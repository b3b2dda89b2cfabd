"""Running work units: the local process pool, supervised time limits, Dask."""
