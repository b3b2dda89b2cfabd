"""Validate a DataFrame against a list of Great Expectations expectations, and turn GX's
validation result into plain values (counts, a few offending values) for check metadata.

GX does all the validating; this module only chooses GX's fast settings and translates:

* one ephemeral context per process, built on first use; suites are never registered in it,
  so repeated validations leave nothing behind;
* one validation per table with the whole suite, on the table narrowed to the columns the
  suite reads (GX fingerprints the whole batch it is given, 0.5 s for ten columns of
  ReXGradient train's 239k rows);
* result format BASIC with a short partial list: counts and the first few offending values,
  never per-row index lists;
* a per-expectation GX error (missing column, type mismatch) or a failure of the whole run is
  a failed outcome carrying the exception message, so an error can never read as a pass.
"""

from __future__ import annotations

import gc
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import great_expectations as gx
import great_expectations.expectations as gxe
import numpy as np
import pandas as pd
from great_expectations.data_context.types.base import (
    DataContextConfig,
    InMemoryStoreBackendDefaults,
    ProgressBarsConfig,
)
from great_expectations.validator.v1_validator import Validator

from .suite_reports import SAMPLE_SIZE, ExpectationOutcome, SuiteReport

# GX's import leaves ~150k long-lived objects. Frozen, later collections skip them, and so does
# the interpreter's at exit, which otherwise took seconds in every process that imported GX.
gc.freeze()

RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": SAMPLE_SIZE}

# Keyword arguments naming the columns an expectation reads.
_COLUMN_KWARGS = ("column", "column_A", "column_B", "column_list", "column_set")
_NOT_DESCRIBED = frozenset({"batch_id"})
_COLUMN_SET = "expect_table_columns_to_match_set"


def describe(expectation: gxe.Expectation) -> str:
    """GX's name of the expectation and its arguments, e.g.
    ``expect_column_values_to_be_unique(column=image_id)``."""
    config = expectation.configuration
    return _described(config.type, config.kwargs)


def validate(
    frame: pd.DataFrame, suite: str, expectations: Sequence[gxe.Expectation]
) -> SuiteReport:
    """Validate ``frame`` against ``expectations`` in one GX validation."""
    wanted = [describe(expectation) for expectation in expectations]
    narrowed = _columns_read(frame, expectations)
    with _LOCK:
        try:
            validator = Validator(
                batch_definition=_batch_definition(),
                batch_parameters={"dataframe": narrowed},
                result_format=RESULT_FORMAT,
            )
            result = validator.validate_expectation_suite(
                gx.ExpectationSuite(name=suite, expectations=[e.copy() for e in expectations])
            )
        except Exception as exc:  # a whole-run GX failure must not read as a pass
            message = f"{type(exc).__name__}: {exc}"
            return SuiteReport(suite, tuple(_failed(name, [message]) for name in wanted))
    # GX may reorder results: match them back by what each expectation says.
    by_name = {
        _described(r.expectation_config.type, r.expectation_config.kwargs): r
        for r in result.results
    }
    outcomes = tuple(
        _outcome(name, by_name[name])
        if name in by_name
        else _failed(name, ["no result returned by Great Expectations"])
        for name in wanted
    )
    return SuiteReport(suite, outcomes)


def _columns_read(frame: pd.DataFrame, expectations: Iterable[gxe.Expectation]) -> pd.DataFrame:
    """``frame`` narrowed to the columns the expectations name, unless one of them looks at
    the whole table (column counts, exact column sets, ordered column lists)."""
    named: set[str] = set()
    for expectation in expectations:
        kwargs = expectation.configuration.kwargs
        columns = [kwargs[key] for key in _COLUMN_KWARGS if key in kwargs]
        exact_set = "column_set" in kwargs and kwargs.get("exact_match", True) is not False
        if not columns or exact_set:
            return frame
        for value in columns:
            named.update([value] if isinstance(value, str) else value)
    return frame[[column for column in frame.columns if column in named]]


def _outcome(name: str, gx_result: Any) -> ExpectationOutcome:
    errors = _raised_exception_messages(gx_result.exception_info)
    if errors:
        return _failed(name, errors)
    result = gx_result.result or {}
    success = gx_result.success is True
    count = result.get("unexpected_count")
    sample = list(result.get("partial_unexpected_list") or ())
    if gx_result.expectation_config.type == _COLUMN_SET:
        # No rows to sample: the offending values are the missing (and unexpected) columns.
        mismatched = (result.get("details") or {}).get("mismatched") or {}
        sample = [*mismatched.get("missing", ()), *mismatched.get("unexpected", ())]
        count = len(sample)
    elif not success and not sample and "observed_value" in result:
        # Aggregate expectations (row count, column max, ...) report what they saw.
        sample = [result["observed_value"]]
    return ExpectationOutcome(
        expectation=name,
        success=success,
        unexpected_count=None if count is None else int(count),
        unexpected_sample=tuple(_to_json_value(v) for v in sample[:SAMPLE_SIZE]),
    )


def _raised_exception_messages(exception_info: Any) -> list[str]:
    """Messages of the exceptions in GX's ``exception_info``: a flat
    ``{"raised_exception": ..., "exception_message": ...}``, or a mapping of metric id to
    such dicts when resolving a metric failed."""
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


def _failed(name: str, messages: Sequence[str]) -> ExpectationOutcome:
    return ExpectationOutcome(name, False, None, tuple(messages[:SAMPLE_SIZE]))


def _described(kind: str, kwargs: Mapping[str, Any]) -> str:
    # Sorted: GX adds and reorders keyword arguments in the configurations of its results.
    args = ", ".join(
        f"{key}={_argument(kwargs[key])}" for key in sorted(kwargs) if key not in _NOT_DESCRIBED
    )
    return f"{kind}({args})"


def _argument(value: Any) -> str:
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ", ".join(_argument(v) for v in value) + "]"
    return value if isinstance(value, str) else repr(value)


def _to_json_value(value: Any) -> Any:
    """numpy/pandas scalars as str/int/float/bool/None; pairs as tuples of those."""
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
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


_LOCK = threading.RLock()
# (pid, batch definition): rebuilt in a forked child, whose copied GX state is not its own.
_STATE: tuple[int, Any] | None = None


def _batch_definition() -> Any:
    """The process's whole-dataframe batch definition in its ephemeral context."""
    global _STATE
    if _STATE is None or _STATE[0] != os.getpid():
        config = DataContextConfig(
            # No temporary data-docs site: docs are never rendered.
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            analytics_enabled=False,
            # tqdm bars per validation would flood the step logs.
            progress_bars=ProgressBarsConfig(globally=False),
        )
        context = gx.get_context(mode="ephemeral", project_config=config)
        asset = context.data_sources.add_pandas("radharmony").add_dataframe_asset("table")
        _STATE = (os.getpid(), asset.add_batch_definition_whole_dataframe("whole_table"))
    return _STATE[1]
