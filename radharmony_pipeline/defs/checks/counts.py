"""Per-partition counts checked against the dataset documentation (or expected_counts.json)."""

import dagster as dg

from ...sources.base import DatasetSource
from ...sources.counts import CountComparison


def comparison_result(
    source: DatasetSource,
    split: str,
    origin: str,
    comparisons: list[CountComparison],
    found: dict[str, int],
    error_rows: int = 0,
    strict: bool = False,
) -> dg.AssetCheckResult:
    """Pass when every comparison matches; metadata shows expected vs found and hints.

    A shortfall that the partition's `error_rows` can explain (bad entries are kept
    as error rows, reported by their own check) is a warning unless strict, so the good rows
    still flow; any other mismatch blocks downstream.
    """
    mismatches = [c for c in comparisons if not c.matches]
    explained = (
        bool(mismatches)
        and not strict
        and all(_explained_by_errors(c, error_rows) for c in mismatches)
    )
    metadata = {
        "expected_from": origin,
        "found": dg.MetadataValue.json(found),
        "comparison": dg.MetadataValue.md(comparison_table(comparisons)),
    }
    if not comparisons:
        metadata["note"] = (
            f"the documentation gives no per-split counts for {source.key} {split}; "
            "its dataset totals are checked once every split is in the manifest"
        )
    if mismatches:
        metadata["mismatches"] = dg.MetadataValue.json(
            {c.metric: {"expected": c.expected, "found": c.found} for c in mismatches}
        )
        metadata["probably_missing"] = dg.MetadataValue.md(
            "\n".join(f"- {_hint(source, split, c)}" for c in mismatches)
        )
    description = (
        "; ".join(f"{c.metric}: expected {c.expected}, found {c.found}" for c in mismatches)
        or f"{len(comparisons)} documented counts match"
    )
    if explained:
        metadata["error_rows"] = error_rows
        description += (
            f" — short by no more than the {error_rows} error row(s) of this partition "
            "(see the *_error_rows check); not blocking"
        )
    return dg.AssetCheckResult(
        passed=not mismatches,
        severity=dg.AssetCheckSeverity.WARN if explained else dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
        description=description,
    )


# Metrics counting annotations rather than images: one error row may hide several of them.
_ANNOTATION_METRICS = ("annotations", "class_annotations", "boxes")


def _explained_by_errors(comparison: CountComparison, error_rows: int) -> bool:
    """Whether `error_rows` bad entries can explain this shortfall (never an excess)."""
    found = comparison.found or 0
    if error_rows < 1 or found >= comparison.expected:
        return False
    if comparison.metric.split(".")[0] in _ANNOTATION_METRICS:
        return True
    return comparison.expected - found <= error_rows


def comparison_table(comparisons: list[CountComparison]) -> str:
    rows = ["| metric | expected | found | |", "|---|---:|---:|---|"]
    rows += [
        f"| {c.metric} | {c.expected} | {'—' if c.found is None else c.found} "
        f"| {'ok' if c.matches else 'MISMATCH'} |"
        for c in comparisons
    ]
    return "\n".join(rows)


def _hint(source: DatasetSource, split: str, comparison: CountComparison) -> str:
    return hint(source, [split], comparison)


def hint(source: DatasetSource, splits: list[str], comparison: CountComparison) -> str:
    """What a mismatch of this metric probably means, naming the files to look at."""
    files = ", ".join(str(p) for split in splits for p in source.annotation_files(split))
    split = splits[0] if len(splits) == 1 else "<split>"
    metric = comparison.metric.rsplit(": ", 1)[-1]
    where = source.count_hints.get(metric.split(".")[0], "the dataset's files")
    direction = "fewer" if (comparison.found or 0) < comparison.expected else "more"
    return (
        f"{comparison.metric}: {direction} than documented "
        f"({comparison.found} vs {comparison.expected}); check "
        + where.format(split=split, file=files)
        + f" — the download may be incomplete or a different release (files: {files})"
    )
