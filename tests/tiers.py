"""The test tiers (markers declared in pyproject.toml): which tests a build fixture marks, which
test modules a `-m` selection leaves out without importing them, and which package modules a
selection never imports (`make test-fast` checks that list against the Makefile's)."""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import radharmony_pipeline

# Session fixtures that materialize the whole asset graph: a test that uses one is a `build`
# test whatever its own markers say, so a new test is classified by what it asks for. A test
# module lists its own fixtures that build in a `BUILD_FIXTURES` tuple of the same meaning.
BUILD_FIXTURES = ("tiny_corpus", "tiny_demo")
PACKAGE = radharmony_pipeline.__name__


def mark_build_fixture_users(items: Iterable[pytest.Item]) -> None:
    for item in items:
        module_fixtures = getattr(getattr(item, "module", None), "BUILD_FIXTURES", ())
        used = getattr(item, "fixturenames", ())
        if any(fixture in used for fixture in (*BUILD_FIXTURES, *module_fixtures)):
            item.add_marker(pytest.mark.build)


def module_markers(path: Path) -> set[str]:
    """The markers a test module's `pytestmark` gives all its tests, read without importing it."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets
        ):
            value = node.value
            marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            return {name for name in map(_mark_name, marks) if name}
    return set()


def _mark_name(node: ast.expr) -> str | None:
    """NAME of `pytest.mark.NAME` or `pytest.mark.NAME(...)`."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
        return node.attr if node.value.attr == "mark" else None
    return None


def excludes_every_test(markexpr: str, markers: set[str]) -> bool:
    """Whether `-m markexpr` deselects every test that carries `markers`, whatever other
    markers a test adds. False when the expression is more than names, and, or, not, ()."""
    try:
        expression = ast.parse(markexpr, mode="eval").body
        names = {node.id for node in ast.walk(expression) if isinstance(node, ast.Name)}
        others = sorted(names - markers)
        return not any(
            _selects(expression, markers | set(added))
            for count in range(len(others) + 1)
            for added in itertools.combinations(others, count)
        )
    except (SyntaxError, ValueError):
        return False


def _selects(node: ast.expr, markers: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in markers
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _selects(node.operand, markers)
    if isinstance(node, ast.BoolOp):
        values = [_selects(value, markers) for value in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    raise ValueError(f"not a marker expression: {ast.unparse(node)}")


def package_modules() -> set[str]:
    """Every module of the package, from its files (importing them would count as a use)."""
    root = Path(radharmony_pipeline.__file__).parent
    return {
        ".".join((PACKAGE, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for path in root.rglob("*.py")
    }


def imported_package_modules() -> set[str]:
    return {name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")}


def unimported_modules_report(imported: set[str], expected: set[str]) -> tuple[bool, list[str]]:
    """(whether the package modules never imported are exactly `expected`, the lines saying so)."""
    unimported = package_modules() - imported
    listed, unlisted, stale = unimported & expected, unimported - expected, expected - unimported
    lines = [f"package modules never imported here, as listed: {_names(listed)}"]
    if unlisted:
        lines.append(
            f"package modules never imported here and not listed: {_names(unlisted)} (test them "
            "in this tier, or list them in the Makefile with the reason)"
        )
    if stale:
        lines.append(f"listed as never imported here, but imported: {_names(stale)}")
    return not unlisted and not stale, lines


def _names(modules: set[str]) -> str:
    return ", ".join(sorted(modules)) or "none"
