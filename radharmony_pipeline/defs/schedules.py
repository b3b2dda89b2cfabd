"""Schedules: the nightly observation of the downloads (what the rebuild sensor reacts to)."""

import os

import dagster as dg

from .jobs import observe_source_files_job

OBSERVE_CRON_ENV = "RADHARMONY_OBSERVE_CRON"
DEFAULT_OBSERVE_CRON = "0 2 * * *"  # nightly, 02:00

nightly_observation = dg.ScheduleDefinition(
    name="observe_source_files_nightly",
    job=observe_source_files_job,
    cron_schedule=os.environ.get(OBSERVE_CRON_ENV) or DEFAULT_OBSERVE_CRON,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description=f"Fingerprint every partition's downloads (cron from {OBSERVE_CRON_ENV}).",
)
