"""The project's Definitions: everything under defs/ plus the resources (workspace.yaml, `dg`
and `dagster dev` load `defs`; tests build their own with `build_definitions`)."""

import gc
from pathlib import Path

import dagster as dg

from .defs.resources import pipeline_resources
from .defs.run_settings import validate_environment
from .operations.recovery import executor_freeing_dead_runs_slots

# Dagster's default executor (a run config may still choose `multiprocess` or `in_process`), but
# running every step in the run's own process unless told otherwise. A step started in a
# process of its own re-imports Dagster and the definitions first (a large share of the
# `raw_index,labels` CLI run, benchmarks/bench_checks.py), and parallel steps gain little:
# the heavy ones spread their images over every core themselves and share one pool slot
# (dagster_home/dagster.yaml).
STEPS_IN_RUN_PROCESS = dg.ExecutorDefinition(
    name=dg.multi_or_in_process_executor.name,
    config_schema=dg.Field(
        dg.multi_or_in_process_executor.config_schema.config_type,
        default_value={"in_process": {}},
    ),
    requirements=dg.multi_or_in_process_executor.get_requirements,
    # Every run, however launched, first frees the slots of killed runs (operations/recovery.py).
    executor_creation_fn=executor_freeing_dead_runs_slots(
        dg.multi_or_in_process_executor.executor_creation_fn
    ),
    description="Steps in the run's process by default; `multiprocess` on request.",
)


def build_definitions(
    data_root: str | Path | None = None, output_root: str | Path | None = None
) -> dg.Definitions:
    """Every asset, check, job, schedule and sensor found under defs/, with the resources.

    A new module under defs/ is picked up without an edit here. Unset roots come from the
    environment (see `pipeline_resources`). Settings are validated first, once, so a bad
    RADHARMONY_* value stops here with a message naming the variable.
    """
    validate_environment()
    return dg.Definitions.merge(
        dg.load_from_defs_folder(path_within_project=Path(__file__).parent),
        dg.Definitions(
            resources=pipeline_resources(data_root, output_root), executor=STEPS_IN_RUN_PROCESS
        ),
    )


defs = build_definitions()
# Everything imported so far lives as long as the process. Frozen, it is left out of every later
# garbage collection, the interpreter's own at exit included: without this, a step worker
# spent about a second at exit walking Dagster's and pandas' objects (design notes, "Checks").
gc.freeze()
