"""Incremental rebuilds: the conditions under which a stage is rebuilt, and the sensor that
requests those runs."""

import dagster as dg

from .groups import CORPUS_JOINS

# Downstream stages run when an upstream partition's data version changes (or is newly
# materialized), once each upstream is present; a stage whose code version changed (a new
# report labeler: its version is derived from its rules) is rebuilt too, and what reads it
# follows as for any change.
# (The code version first: an operand of an "or" is evaluated only on what the operands before
# it left false, and keeps no record of the version it last saw otherwise.)
REBUILD_WHEN_CHANGED = (
    dg.AutomationCondition.code_version_changed() | dg.AutomationCondition.eager()
).with_label("its code version changed, or eager")

# A partition of a stage is due for a rebuild while one of its own inputs changed after it was
# last built (its run may not have started yet, or may be launched one stage at a time).
_REBUILD_DUE = (
    dg.AutomationCondition.any_deps_match(dg.AutomationCondition.newly_updated())
    .since(dg.AutomationCondition.newly_updated())
    .with_label("an input changed since it was last built")
)

# The manifest joins every partition: it is rebuilt once, after the changed partitions'
# stages have all finished — not alongside them, and not again for each stage that lands.
# Joiners over every partition (groups.CORPUS_JOINS: the manifest, near_duplicates, the
# corpus profile, the parents tables) do not wait for one another: requested in the same
# tick, they run as one run.
REBUILD_WHEN_PARTITIONS_SETTLE = (
    dg.AutomationCondition.eager()
    & ~dg.AutomationCondition.any_deps_match(_REBUILD_DUE).ignore(CORPUS_JOINS)
).with_label("eager, once no upstream partition is being or due to be rebuilt")

rebuild_sensor = dg.AutomationConditionSensorDefinition(
    "rebuild_changed_partitions",
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    # One run per requested partition, tagged with it, rather than one backfill per tick: a
    # tick then lists runs that each name their partition (`dagster/partition`).
    emit_backfills=False,
    description="Requests one run per partition whose sources or upstream tables changed "
    "(stages), and the manifest once those runs have finished.",
)
