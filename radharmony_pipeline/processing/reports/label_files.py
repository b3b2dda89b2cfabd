"""Label files of any labeler (CheXpert's column names or ours, 1 / 0 / -1 / blank), read one
way for every user: `radharmony label-reports --agreement`, MIMIC-CXR's CheXpert file, the
labelled sets and the real-report benchmark."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from radharmony_pipeline.processing.tables.table_schemas import REPORT_LABEL_PREFIX
from radharmony_pipeline.vocabulary import REPORT_LABEL_VALUES, REPORT_OBSERVATIONS, unified_class


class LabelFileError(ValueError):
    """A label file that cannot be read as labels: the problem, and the row (the file's line,
    counting the header as 1) and column where it is, when there is one."""

    def __init__(self, problem: str, row: int | None = None, column: str | None = None):
        where = [*([f"row {row}"] if row else []), *([f"column {column!r}"] if column else [])]
        super().__init__(": ".join([*where, problem]))
        self.problem, self.row, self.column = problem, row, column


class LabelValueError(ValueError):
    """A label cell that is not 1, 0, -1 or blank: its row position and value."""

    def __init__(self, position: int, value: object):
        super().__init__(f"{value!r} is not 1, 0, -1 or blank")
        self.position = position
        self.value = value


def observation_of(name: str, prefix: str = "") -> str | None:
    """The report observation a column or class name denotes (`Pleural Effusion`,
    `No Finding`, `report_label_edema`, `pleural_effusion`, after `prefix` when one is given:
    `gold_Effusion`), or None when it names none."""
    if not str(name).startswith(prefix):
        return None
    bare = str(name).removeprefix(prefix).removeprefix(REPORT_LABEL_PREFIX)
    try:
        observation = unified_class(bare)
    except KeyError:
        return None
    return observation if observation in REPORT_OBSERVATIONS else None


def observation_columns(columns: Iterable[str], prefix: str = "") -> dict[str, str]:
    """Of `columns`, those naming a report observation: {column: observation}. Raises
    LabelFileError when two columns name the same observation."""
    found: dict[str, str] = {}
    for column in columns:
        observation = observation_of(column, prefix)
        if observation is None:
            continue
        if observation in found.values():
            other = next(c for c, o in found.items() if o == observation)
            raise LabelFileError(f"columns {other!r} and {column!r} both name {observation}")
        found[column] = observation
    return found


def tri_state_labels(values: pd.Series) -> pd.Series:
    """Labels written as 1/0/-1 (1.0, "-1"; blank = null) as nullable Int8; raises
    LabelValueError at the first other value."""
    text = values.astype("string").str.strip()
    numbers = pd.to_numeric(text.mask(text == ""), errors="coerce")
    bad = (text.notna() & (text != "") & ~numbers.isin(list(REPORT_LABEL_VALUES))).to_numpy()
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise LabelValueError(first, values.iloc[first])
    return pd.Series(numbers.to_numpy(dtype=float), index=values.index).astype("Int8")


def label_columns(table: pd.DataFrame, prefix: str = "") -> pd.DataFrame:
    """The observation columns of a label file's table, one nullable Int8 column per
    observation (named by it), in the table's row order. Raises LabelFileError when no column
    names an observation, when two name the same one, or at the first value that is not 1, 0,
    -1 or blank (naming its row and column)."""
    columns = observation_columns(table.columns, prefix)
    if not columns:
        raise LabelFileError(
            f"no observation column (e.g. `{prefix}Pleural Effusion`, `{prefix}No Finding`)"
        )
    labels = {}
    for column, observation in columns.items():
        try:
            labels[observation] = tri_state_labels(table[column])
        except LabelValueError as error:
            raise LabelFileError(str(error), error.position + 2, column) from error
    return pd.DataFrame(labels, index=table.index)
