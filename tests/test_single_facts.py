"""Vocabulary words written once: an AST scan of the package finds the union mask class and
the row statuses only where vocabulary.py defines them, and every `RADHARMONY_*` variable the
package names is one settings.py or a dataset's module under sources/ declares."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import radharmony_pipeline
from radharmony_pipeline import settings, vocabulary
from radharmony_pipeline.sources import SOURCE_TYPES
from radharmony_pipeline.sources.nih_chestxray14 import ENV_VAR as NIH_ROOT_VARIABLE

PACKAGE = Path(radharmony_pipeline.__file__).parent
VOCABULARY = Path(vocabulary.__file__)
STATUS_WORDS = {vocabulary.STATUS_OK, vocabulary.STATUS_ERROR}


def package_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@functools.cache
def parsed(path: Path) -> ast.AST:
    """The module's tree, each node knowing its parent (parsed once for every scan)."""
    return with_parents(ast.parse(path.read_text(), filename=str(path)))


def with_parents(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
    return tree


def literals(tree: ast.AST, words: set[str]) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in words:
            yield node


def statement_of(node: ast.AST) -> ast.AST:
    while not isinstance(node, ast.stmt):
        node = node.parent  # type: ignore[attr-defined]
    return node


def defines_constant(node: ast.Constant, relative: str) -> bool:
    """`NAME = "any"` in vocabulary.py, the one place the words are written."""
    return relative == str(VOCABULARY.relative_to(PACKAGE)) and isinstance(
        statement_of(node), ast.Assign
    )


def mentions_status(statement: ast.AST) -> bool:
    for node in ast.walk(statement):
        if isinstance(node, ast.Constant) and node.value == "status":
            return True
        if isinstance(node, ast.Name) and node.id == "status":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "status":
            return True
        if isinstance(node, ast.keyword) and node.arg == "status":
            return True
    return False


def names_a_column(node: ast.Constant) -> bool:
    """`"error"` as the `error` column's name: `t["error"]`, `t.loc[rows, "error"]`, a list of
    column names with "status", or `"error" in t`."""
    parent = node.parent  # type: ignore[attr-defined]
    if isinstance(parent, ast.Subscript) and parent.slice is node:
        return True
    if isinstance(parent, ast.Tuple) and isinstance(parent.parent, ast.Subscript):
        return parent.parent.slice is parent
    if isinstance(parent, ast.List | ast.Tuple | ast.Set):
        return any(isinstance(e, ast.Constant) and e.value == "status" for e in parent.elts)
    if isinstance(parent, ast.Compare) and parent.left is node:
        return all(isinstance(op, ast.In | ast.NotIn) for op in parent.ops)
    return False


def is_status_literal(node: ast.Constant) -> bool:
    """`ok` / `error` in a statement about a row's status, other than the `error` column's
    name (`ok` and `error` also show a check's or a run's outcome, a word of its own)."""
    return mentions_status(statement_of(node)) and not (
        node.value == vocabulary.STATUS_ERROR and names_a_column(node)
    )


def status_literals(path: Path) -> list[str]:
    relative = str(path.relative_to(PACKAGE))
    tree = parsed(path)
    return [
        f"{relative}:{node.lineno}: {node.value!r}"
        for node in literals(tree, STATUS_WORDS)
        if not defines_constant(node, relative) and is_status_literal(node)
    ]


def union_class_literals(path: Path) -> list[str]:
    relative = str(path.relative_to(PACKAGE))
    tree = parsed(path)
    return [
        f"{relative}:{node.lineno}"
        for node in literals(tree, {vocabulary.UNION_CLASS})
        if not defines_constant(node, relative)
        # pandas' `how="any"` is a different word.
        and not (isinstance(node.parent, ast.keyword) and node.parent.arg == "how")  # type: ignore[attr-defined]
    ]


def test_the_union_class_is_written_only_as_its_constant():
    found = [hit for path in package_modules() for hit in union_class_literals(path)]
    assert found == [], f"use vocabulary.UNION_CLASS: {found}"


def test_row_statuses_are_written_only_as_their_constants():
    found = [hit for path in package_modules() for hit in status_literals(path)]
    assert found == [], f"use vocabulary.STATUS_OK / STATUS_ERROR: {found}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('ok = t[t["status"] == "ok"]', 1),
        ('bad = t.loc[t["status"] == "error", "error"]', 1),
        ('row(status="error", error=message)', 1),
        ('status.iloc[positions] = "error"', 1),
        ('t.drop(columns=["status", "error"])', 0),
        ('reason = t.loc[bad, "error"]', 0),
        ('x = t["error"] if "error" in t else None', 0),
        ("print('ok' if run.success else 'FAILED')", 0),
    ],
)
def test_the_status_scan_tells_a_status_from_the_error_column(source, expected):
    """The scan is only as good as its reading of a statement: these are the shapes the
    package writes, each judged as it should be."""
    tree = with_parents(ast.parse(source))
    hits = [node for node in literals(tree, STATUS_WORDS) if is_status_literal(node)]
    assert len(hits) == expected


def every_variable() -> list[str]:
    """Every `RADHARMONY_*` variable the pipeline reads: settings.py's own, and each dataset's
    location variables as its module under sources/ declares them (`env_vars`)."""
    own = [settings.DATA_ROOT_VARIABLE, settings.OUTPUT_ROOT_VARIABLE, *settings.PARSERS]
    datasets = [v for source in SOURCE_TYPES.values() for v in source.env_vars.values()]
    return [*own, *datasets, NIH_ROOT_VARIABLE]


def test_every_variable_the_package_names_is_a_listed_setting():
    """Every `RADHARMONY_*` variable is settings.py's or a dataset module's; no module reads
    one that the list does not hold."""
    listed = set(every_variable())
    named = {
        name
        for path in package_modules()
        for name in re.findall(r"RADHARMONY_[A-Z0-9_]+", path.read_text())
    }
    assert named - listed == set()
