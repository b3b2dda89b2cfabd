"""Declarative data-quality expectations validated with Great Expectations 1.x.

Callers describe a suite as a list of :class:`Expectation` values (a GX class name plus its
kwargs, usually built with the helper constructors below), hand it to :func:`validate_table`
together with a pandas DataFrame, and get back a plain-Python :class:`SuiteReport` that is
easy to turn into JSON / Dagster metadata. Nothing GX-specific leaks out of this module.

Design notes:

* ``great_expectations`` takes seconds to import, so it is imported lazily inside functions
  and one ephemeral context (with one pandas datasource, dataframe asset and whole-dataframe
  batch definition) is built on first use and reused for every later call in the process.
  Suites are plain in-memory ``ExpectationSuite`` objects that are never registered with the
  context, so repeated calls do not accumulate suites, datasources or batch definitions.
* GX reports a per-expectation error (unknown column, type mismatch, ...) as a *failed*
  result carrying ``exception_info``; we surface the exception message in the outcome's
  ``unexpected_sample`` so an error can never read as a pass.
* Column-map expectations in GX skip nulls. That is what we want for ``in_set`` / ``between``
  (null means "not annotated"), but ``non_empty_string`` must also reject nulls; it does so
  through the layer-level kwarg ``forbid_null``.
* Expectations that GX's pandas engine evaluates slowly on large tables (uniqueness, nulls,
  regexes, column sets: 0.2-2 s each on ReXGradient train's 239k rows) are evaluated here as
  vectorized pandas masks with the same semantics; the rest go to GX in one validation.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from .vocabulary import (
    IMAGE_FORMATS,
    INDEX_COLUMNS,
    SPLITS,
    UNIFIED_LABELS,
    VIEW_POSITIONS,
)

SAMPLE_SIZE = 5
"""Maximum number of offending values kept per outcome."""

FORBID_NULL = "forbid_null"
"""Layer-level kwarg: also count nulls in ``column`` as unexpected (GX map checks skip nulls)."""

# Kwargs that name a single column that must exist for the expectation to make sense.
_COLUMN_KEYS = ("column", "column_A", "column_B")
# Kwargs that name several columns that must all exist (multicolumn / compound expectations).
_COLUMN_LIST_KEYS = ("column_list",)
# Table-level expectations that look at the frame's full column list; for these the frame
# handed to GX must not be narrowed to the referenced columns.
_WHOLE_TABLE_KINDS = frozenset(
    {
        "ExpectTableColumnCountToEqual",
        "ExpectTableColumnCountToBeBetween",
        "ExpectTableColumnsToMatchOrderedList",
    }
)
_META_INDEX = "radharmony_index"

RAW_INDEX_COLUMNS = INDEX_COLUMNS
IMAGE_KEY_REGEX = r"^[A-Za-z0-9._-]+$"
MAX_IMAGE_SIDE = 100_000
# Textual spellings of "missing" that must have been normalised to a real null upstream.
NULL_LIKE_STRINGS: tuple[str, ...] = ("None", "nan", "NaN", "")


# --------------------------------------------------------------------------------------
# Public value types
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """One declarative expectation: GX class name (e.g. 'ExpectColumnValuesToBeUnique') + kwargs.

    ``kwargs`` are passed to the GX expectation class unchanged, except for the layer-level
    ``forbid_null`` flag (see module docstring). They are frozen into a read-only mapping so
    a suite definition cannot be mutated after construction.
    """

    kind: str
    kwargs: Mapping[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))

    def __hash__(self) -> int:
        # The generated hash would fail on the mapping; describe() captures the same identity.
        return hash(self.describe())

    def describe(self) -> str:
        """Human-readable identity, e.g. ``ExpectColumnValuesToBeUnique(column=image_id)``."""
        args = ", ".join(f"{key}={_format_arg(value)}" for key, value in self.kwargs.items())
        return f"{self.kind}({args})"

    def columns(self) -> tuple[str, ...]:
        """Columns this expectation needs to exist (table-level column sets excluded)."""
        names: list[str] = [self.kwargs[k] for k in _COLUMN_KEYS if k in self.kwargs]
        for key in _COLUMN_LIST_KEYS:
            names.extend(self.kwargs.get(key) or ())
        return tuple(names)


@dataclass(frozen=True)
class ExpectationOutcome:
    """Result of one expectation, reduced to JSON-friendly values."""

    expectation: str  # Expectation.describe() text
    success: bool
    unexpected_count: int | None
    unexpected_sample: tuple  # up to SAMPLE_SIZE offending values (str/int/float/bool/None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "expectation": self.expectation,
            "success": self.success,
            "unexpected_count": self.unexpected_count,
            "unexpected_sample": _to_json_list(self.unexpected_sample),
        }


@dataclass(frozen=True)
class SuiteReport:
    """All outcomes of one suite run against one table."""

    suite: str
    success: bool
    outcomes: tuple[ExpectationOutcome, ...]

    @property
    def failures(self) -> tuple[ExpectationOutcome, ...]:
        return tuple(outcome for outcome in self.outcomes if not outcome.success)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly digest: suite name, counts and the failed outcomes."""
        failures = self.failures
        return {
            "suite": self.suite,
            "evaluated": len(self.outcomes),
            "failed": len(failures),
            "failures": [
                {k: v for k, v in outcome.to_dict().items() if k != "success"}
                for outcome in failures
            ],
        }


# --------------------------------------------------------------------------------------
# Helper constructors (callers never need GX class names)
# --------------------------------------------------------------------------------------


def unique(column: str) -> Expectation:
    """No two non-null values of ``column`` are equal (nulls are ignored)."""
    return Expectation("ExpectColumnValuesToBeUnique", {"column": column})


def not_null(column: str) -> Expectation:
    return Expectation("ExpectColumnValuesToNotBeNull", {"column": column})


def non_empty_string(column: str) -> Expectation:
    """Every value is a string of length ≥ 1; null is a violation too."""
    return Expectation(
        "ExpectColumnValuesToMatchRegex", {"column": column, "regex": ".+", FORBID_NULL: True}
    )


def in_set(column: str, values: Iterable[Any]) -> Expectation:
    """Non-null values are in ``values``; nulls are allowed (they mean "not annotated")."""
    return Expectation(
        "ExpectColumnValuesToBeInSet", {"column": column, "value_set": tuple(values)}
    )


def not_in_set(column: str, values: Iterable[Any]) -> Expectation:
    return Expectation(
        "ExpectColumnValuesToNotBeInSet", {"column": column, "value_set": tuple(values)}
    )


def between(
    column: str,
    min_value: float | None,
    max_value: float | None,
    strict_min: bool = False,
    strict_max: bool = False,
) -> Expectation:
    """Non-null values lie in [min_value, max_value] (bounds exclusive if strict); nulls pass."""
    kwargs: dict[str, Any] = {"column": column, "min_value": min_value, "max_value": max_value}
    # Only spell out non-default flags so describe() stays short.
    if strict_min:
        kwargs["strict_min"] = True
    if strict_max:
        kwargs["strict_max"] = True
    return Expectation("ExpectColumnValuesToBeBetween", kwargs)


def matches_regex(column: str, regex: str) -> Expectation:
    """Non-null values match ``regex`` (``re.search`` semantics: anchor it if needed)."""
    return Expectation("ExpectColumnValuesToMatchRegex", {"column": column, "regex": regex})


def columns_exist(columns: Iterable[str]) -> Expectation:
    """The table has at least these columns (extra columns are fine)."""
    return Expectation(
        "ExpectTableColumnsToMatchSet", {"column_set": tuple(columns), "exact_match": False}
    )


def pair_a_less_than_b(column_a: str, column_b: str) -> Expectation:
    """``column_a < column_b`` row-wise, e.g. box ``x_min < x_max``.

    Rows where either side is null are skipped; null checks belong to ``not_null``. Sample
    entries are pairs in GX's ``(column_A, column_B)`` order, i.e. ``(value_b, value_a)``.
    """
    return Expectation(
        "ExpectColumnPairValuesAToBeGreaterThanB",
        {
            "column_A": column_b,
            "column_B": column_a,
            "or_equal": False,
            "ignore_row_if": "either_value_is_missing",
        },
    )


# --------------------------------------------------------------------------------------
# Suites of the pipeline's tables
# --------------------------------------------------------------------------------------


def raw_index_expectations() -> list[Expectation]:
    """Suite for the per-dataset raw image index (extra dataset-specific columns allowed)."""
    return [
        columns_exist(RAW_INDEX_COLUMNS),
        unique("image_id"),
        not_null("image_id"),
        unique("image_key"),
        not_null("image_key"),
        matches_regex("image_key", IMAGE_KEY_REGEX),
        non_empty_string("dataset"),
        non_empty_string("split"),
        non_empty_string("image_path"),
        in_set("image_format", IMAGE_FORMATS),
        in_set("split", SPLITS),
        in_set("view_position", VIEW_POSITIONS),
        not_null("view_position"),
        between("source_height", 1, MAX_IMAGE_SIDE),
        between("source_width", 1, MAX_IMAGE_SIDE),
    ]


def labels_expectations(label_columns: Sequence[str]) -> list[Expectation]:
    """Suite for the labels table: one row per image, binary (nullable) label columns."""
    return [
        columns_exist(("image_id", "report", *label_columns)),
        unique("image_id"),
        not_null("image_id"),
        *(in_set(column, (0, 1)) for column in label_columns),
        # A missing report must be a real null, not a stringified one.
        not_in_set("report", NULL_LIKE_STRINGS),
    ]


def mask_expectations() -> list[Expectation]:
    """Suite for the masks table plus derived columns `mask_file_exists` (bool, null for
    error rows), `class_area_fraction` (null on `any` rows) and `image_class`."""
    return [
        columns_exist(
            (
                "image_id",
                "mask_class",
                "mask_path",
                "height",
                "width",
                "area_fraction",
                "source",
                "mask_file_exists",
                "class_area_fraction",
                "image_class",
            )
        ),
        in_set("mask_class", (*UNIFIED_LABELS, "any")),
        in_set("source", ("rle", "polygon", "empty")),
        in_set("status", ("ok", "error")),
        between("area_fraction", 0, 1),
        in_set("mask_file_exists", (True,)),
        between("height", 1, MAX_IMAGE_SIDE),
        between("width", 1, MAX_IMAGE_SIDE),
        # Derived by the caller: class rows exist only where the class is present (never an
        # empty class mask), and one row per (image, class).
        between("class_area_fraction", 0, 1, strict_min=True),
        unique("image_class"),
    ]


def bbox_expectations() -> list[Expectation]:
    """Suite for valid rows of the bboxes table."""
    return [
        columns_exist(
            (
                "image_id",
                "box_index",
                "label",
                "label_text",
                "y_min",
                "y_max",
                "x_min",
                "x_max",
                "x_px",
                "y_px",
                "w_px",
                "h_px",
            )
        ),
        not_null("image_id"),
        in_set("label", UNIFIED_LABELS),
        *(between(column, 0, 1) for column in ("y_min", "y_max", "x_min", "x_max")),
        *(not_null(column) for column in ("y_min", "y_max", "x_min", "x_max")),
        pair_a_less_than_b("y_min", "y_max"),
        pair_a_less_than_b("x_min", "x_max"),
        between("w_px", 1, MAX_IMAGE_SIDE),
        between("h_px", 1, MAX_IMAGE_SIDE),
    ]


def manifest_expectations(label_columns: Sequence[str]) -> list[Expectation]:
    """Suite for the unified manifest."""
    return [
        unique("image_id"),
        not_null("image_id"),
        non_empty_string("image_path"),
        non_empty_string("tensor_path"),
        non_empty_string("source_image_path"),
        in_set("split", SPLITS),
        in_set("view_position", VIEW_POSITIONS),
        not_null("tensor_index"),
        between("orig_height", 1, MAX_IMAGE_SIDE),
        between("orig_width", 1, MAX_IMAGE_SIDE),
        not_null("orig_height"),
        *(in_set(column, (0, 1)) for column in label_columns),
        not_in_set("report", NULL_LIKE_STRINGS),
    ]


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


def validate_table(
    df: pd.DataFrame, suite: str, expectations: Sequence[Expectation]
) -> SuiteReport:
    """Validate ``df`` against ``expectations`` and return one outcome per expectation.

    Outcomes keep the order of ``expectations``. Raises ``ValueError`` only for a malformed
    suite (unknown GX class, invalid kwargs); data problems are always failed outcomes.
    """
    present = set(df.columns)
    outcomes: dict[int, ExpectationOutcome] = {}
    to_gx: dict[int, Expectation] = {}
    for index, expectation in enumerate(expectations):
        missing = [c for c in expectation.columns() if c not in present]
        if missing:
            # Checked here rather than left to GX so the outcome names the column plainly.
            outcomes[index] = _failed(expectation, [f"missing column: {c}" for c in missing])
        elif expectation.kind in _IN_PANDAS:
            outcomes[index] = _run_pandas(df, expectation)
        else:
            to_gx[index] = expectation
    if to_gx:
        outcomes.update(_run_gx(df, suite, to_gx))
    ordered = tuple(outcomes[index] for index in range(len(expectations)))
    return SuiteReport(suite=suite, success=all(o.success for o in ordered), outcomes=ordered)


def _run_gx(
    df: pd.DataFrame, suite_name: str, expectations: Mapping[int, Expectation]
) -> dict[int, ExpectationOutcome]:
    gx_suite = _build_suite(suite_name, expectations)
    frame = _prepare_frame(df, expectations.values())
    with _LOCK:
        batch_definition = _batch_definition()
        try:
            batch = batch_definition.get_batch(batch_parameters={"dataframe": frame})
            result = batch.validate(gx_suite, result_format=_RESULT_FORMAT)
        except Exception as exc:  # a whole-run GX failure must not read as a pass
            message = f"{type(exc).__name__}: {exc}"
            return {i: _failed(e, [message]) for i, e in expectations.items()}
    by_index = {r.expectation_config.meta.get(_META_INDEX): r for r in result.results}
    outcomes: dict[int, ExpectationOutcome] = {}
    for index, expectation in expectations.items():
        gx_result = by_index.get(index)
        if gx_result is None:
            outcomes[index] = _failed(expectation, ["no result returned by Great Expectations"])
            continue
        outcomes[index] = _outcome_from_result(expectation, gx_result)
    return outcomes


def _run_pandas(df: pd.DataFrame, expectation: Expectation) -> ExpectationOutcome:
    """Evaluate one expectation as a vectorized pandas mask with GX's semantics."""
    kwargs = expectation.kwargs
    if expectation.kind == "ExpectTableColumnsToMatchSet":
        missing = [c for c in kwargs["column_set"] if c not in df.columns]
        extra = (
            []
            if kwargs.get("exact_match", True) is False
            else sorted(set(df.columns) - set(kwargs["column_set"]))
        )
        offending = [*missing, *extra]
        return ExpectationOutcome(
            expectation=expectation.describe(),
            success=not offending,
            unexpected_count=len(offending),
            unexpected_sample=_to_json_tuple(offending[:SAMPLE_SIZE]),
        )
    series = df[kwargs["column"]]
    unexpected = _IN_PANDAS[expectation.kind](series, kwargs)
    if kwargs.get(FORBID_NULL):
        unexpected = unexpected | series.isna()
    values = series[unexpected]
    return ExpectationOutcome(
        expectation=expectation.describe(),
        success=not len(values),
        unexpected_count=len(values),
        unexpected_sample=_to_json_tuple(values.head(SAMPLE_SIZE).tolist()),
    )


def _matches_no_regex(series: pd.Series, kwargs: Mapping[str, Any]) -> pd.Series:
    present = series.notna()
    matched = series[present].astype(str).str.contains(kwargs["regex"], regex=True)
    return present & ~matched.reindex(series.index, fill_value=True)


def _outside_bounds(series: pd.Series, kwargs: Mapping[str, Any]) -> pd.Series:
    values = pd.to_numeric(series, errors="coerce").astype("float64")
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    below = pd.Series(False, index=series.index)
    if low is not None:
        below = values <= low if kwargs.get("strict_min") else values < low
    above = pd.Series(False, index=series.index)
    if high is not None:
        above = values >= high if kwargs.get("strict_max") else values > high
    # A non-numeric value is out of bounds, as GX's type error would fail it.
    return series.notna() & (below | above | values.isna())


# Expectation kinds evaluated as masks of the rows GX would report. GX's pandas engine is slow
# on them (0.2-2 s each on ReXGradient train's 239k rows), and when a suite needs nothing
# else, the step never pays GX's import and context (about 2 s, 5 s on a loaded machine).
# Like GX's column-map expectations they skip nulls, except not-null itself.
_IN_PANDAS = {
    "ExpectColumnValuesToBeInSet": lambda s, kw: s.notna() & ~s.isin(list(kw["value_set"])),
    "ExpectColumnValuesToBeBetween": _outside_bounds,
    "ExpectTableColumnsToMatchSet": None,
    "ExpectColumnValuesToBeUnique": lambda s, _: s.notna() & s.duplicated(keep=False),
    "ExpectColumnValuesToNotBeNull": lambda s, _: s.isna(),
    "ExpectColumnValuesToNotBeInSet": lambda s, kw: s.notna() & s.isin(list(kw["value_set"])),
    "ExpectColumnValuesToMatchRegex": _matches_no_regex,
}


# Only the first SAMPLE_SIZE offending values are needed; BASIC avoids the value-count work
# SUMMARY does.
_RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": SAMPLE_SIZE}


def _build_suite(name: str, expectations: Mapping[int, Expectation]) -> Any:
    import great_expectations as gx
    import great_expectations.expectations as gxe

    built = []
    for index, expectation in expectations.items():
        cls = getattr(gxe, expectation.kind, None)
        if not isinstance(cls, type):
            raise ValueError(f"unknown Great Expectations class: {expectation.kind!r}")
        kwargs = _gx_kwargs(expectation.kwargs)
        try:
            # GX may reorder results, so each expectation carries its position in `meta`.
            built.append(cls(**kwargs, meta={_META_INDEX: index}))
        except Exception as exc:
            raise ValueError(f"invalid expectation {expectation.describe()}: {exc}") from exc
    # Passed to the constructor rather than add_expectation(): the latter looks the suite up
    # in the current context's store on every call and silently drops duplicates. The suite
    # is never registered with a context, so nothing is left behind after the call.
    return gx.ExpectationSuite(name=name, expectations=built)


def _gx_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Drop layer-only kwargs and turn tuples (kept for immutability) into GX-style lists."""
    return {
        key: list(value) if isinstance(value, (tuple, frozenset, set)) else value
        for key, value in kwargs.items()
        if key != FORBID_NULL
    }


def _prepare_frame(df: pd.DataFrame, expectations: Iterable[Expectation]) -> pd.DataFrame:
    """Narrow ``df`` to what the expectations read and fix dtypes GX mis-handles."""
    expectations = list(expectations)
    frame = df
    if not any(_needs_full_frame(e) for e in expectations):
        # GX fingerprints the whole batch (falling back to pickling it when a column holds
        # unhashable values such as lists), so only hand it the columns being validated.
        wanted: set[str] = set()
        for expectation in expectations:
            wanted.update(expectation.columns())
            wanted.update(expectation.kwargs.get("column_set") or ())
        frame = df[[c for c in df.columns if c in wanted]]
    pair_columns = {
        expectation.kwargs.get(key)
        for expectation in expectations
        if expectation.kind.startswith("ExpectColumnPair")
        for key in ("column_A", "column_B")
    }
    for column in pair_columns & set(frame.columns):
        dtype = frame[column].dtype
        if isinstance(dtype, pd.api.extensions.ExtensionDtype) and dtype.kind in "iuf":
            # GX's column-pair metrics evaluate `a > b` row by row; with nullable Int/Float
            # columns that yields pd.NA and GX raises "boolean value of NA is ambiguous"
            # unless the row is ignored. As float64, NA becomes NaN and compares as False.
            frame = frame.assign(**{column: frame[column].astype("float64")})
    return frame


def _needs_full_frame(expectation: Expectation) -> bool:
    if expectation.kind in _WHOLE_TABLE_KINDS or "column_index" in expectation.kwargs:
        return True
    if expectation.kind == "ExpectTableColumnsToMatchSet":
        # exact_match defaults to True in GX; only the subset form is narrowing-safe.
        return expectation.kwargs.get("exact_match", True) is not False
    return False


def _outcome_from_result(expectation: Expectation, gx_result: Any) -> ExpectationOutcome:
    errors = _raised_exception_messages(gx_result.exception_info)
    if errors:
        return _failed(expectation, errors)
    result = gx_result.result or {}
    success = gx_result.success is True
    unexpected_count = result.get("unexpected_count")
    sample: list[Any] = list(result.get("partial_unexpected_list") or ())
    if expectation.kind == "ExpectTableColumnsToMatchSet":
        # Map-style fields are absent; the offending values are the missing columns.
        mismatched = (result.get("details") or {}).get("mismatched") or {}
        sample = list(mismatched.get("missing") or ())
        if expectation.kwargs.get("exact_match", True) is not False:
            sample += list(mismatched.get("unexpected") or ())
        unexpected_count = len(sample)
    elif not success and not sample and "observed_value" in result:
        # Aggregate expectations (row count, ...) report what they saw instead.
        sample = [result["observed_value"]]
    return ExpectationOutcome(
        expectation=expectation.describe(),
        success=success,
        unexpected_count=None if unexpected_count is None else int(unexpected_count),
        unexpected_sample=_to_json_tuple(sample[:SAMPLE_SIZE]),
    )


def _raised_exception_messages(exception_info: Any) -> list[str]:
    """Collect messages of raised exceptions from GX's ``exception_info``.

    GX uses two shapes: a flat ``{"raised_exception": ..., "exception_message": ...}`` or a
    mapping of metric id -> that flat dict when metric resolution failed.
    """
    if not exception_info:
        return []
    infos = [exception_info] if "raised_exception" in exception_info else exception_info.values()
    messages = []
    for info in infos:
        if isinstance(info, Mapping) and info.get("raised_exception"):
            message = str(info.get("exception_message") or "exception raised in Great Expectations")
            if message not in messages:
                messages.append(message)
    return messages


def _failed(expectation: Expectation, messages: Sequence[str]) -> ExpectationOutcome:
    return ExpectationOutcome(
        expectation=expectation.describe(),
        success=False,
        unexpected_count=None,
        unexpected_sample=tuple(messages[:SAMPLE_SIZE]),
    )


# --------------------------------------------------------------------------------------
# Shared GX context
# --------------------------------------------------------------------------------------

_LOCK = threading.RLock()
# (pid, batch definition): rebuilt in a forked child, whose copied GX state is not its own.
_STATE: tuple[int, Any] | None = None


def _batch_definition() -> Any:
    """The process-wide whole-dataframe batch definition, built on first use."""
    global _STATE
    with _LOCK:
        if _STATE is None or _STATE[0] != os.getpid():
            _STATE = (os.getpid(), _build_batch_definition())
        return _STATE[1]


def _build_batch_definition() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        # No temp data-docs site: we never render docs.
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        # tqdm bars per validation would flood pipeline logs.
        progress_bars=ProgressBarsConfig(globally=False),
    )
    context = gx.get_context(mode="ephemeral", project_config=config)
    asset = context.data_sources.add_pandas("radharmony").add_dataframe_asset("table")
    return asset.add_batch_definition_whole_dataframe("whole_table")


# --------------------------------------------------------------------------------------
# JSON helpers
# --------------------------------------------------------------------------------------


def _format_arg(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ", ".join(_format_arg(v) for v in value) + "]"
    return repr(value)


def _to_json_tuple(values: Iterable[Any]) -> tuple:
    return tuple(_to_json_value(v) for v in values)


def _to_json_list(values: Iterable[Any]) -> list:
    return [list(v) if isinstance(v, tuple) else v for v in values]


def _to_json_value(value: Any) -> Any:
    """Map numpy/pandas scalars to str/int/float/bool/None; pairs become tuples of those."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list, np.ndarray)):
        return tuple(_to_json_value(v) for v in value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)
