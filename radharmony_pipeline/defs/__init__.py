"""The Dagster face of the pipeline: partitions, assets, checks, IO managers and resources."""

import warnings

import dagster as dg

# Observable partitioned sources and partitioned checks are the Dagster APIs made for this
# job; they are marked beta/preview, which is noted once here, not per run.
warnings.filterwarnings("ignore", category=dg.BetaWarning)
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
