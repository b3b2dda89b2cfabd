"""Schedules: the nightly observation of the downloads (what the rebuild sensor reacts to)."""

import os

import dagster as dg

from ..settings import OBSERVE_CRON_VARIABLE, observe_cron
from .jobs import observe_source_files_job

nightly_observation = dg.ScheduleDefinition(
    name="observe_source_files_nightly",
    job=observe_source_files_job,
    cron_schedule=observe_cron(os.environ),
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description=f"Fingerprint every partition's downloads (cron from {OBSERVE_CRON_VARIABLE}).",
)
