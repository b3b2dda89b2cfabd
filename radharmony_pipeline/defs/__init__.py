"""The Dagster face of the pipeline: partitions, assets, checks, IO managers and resources."""
