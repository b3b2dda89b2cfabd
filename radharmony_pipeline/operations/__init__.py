"""Operating the pipeline from the command line: the demo runner, download checks, crash
recovery and output verification (beside the CLI, outside the folder Dagster loads)."""
