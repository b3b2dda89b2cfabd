"""The package's import structure, read from the source (no import): no cycle between its
modules, and no layer importing one above it.

Layers: sources/ reads the datasets, processing/ computes, defs/ wires Dagster (operations/,
cli.py and definitions.py use them). Neither sources/ nor processing/ imports defs/,
operations/, cli.py, definitions.py or Dagster, nor reads the environment through settings.py:
from it they take constants (variable names, defaults) only, never a parser.

Every import counts: at module level, inside a function, under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import NamedTuple

import pytest

import radharmony_pipeline

PACKAGE = Path(radharmony_pipeline.__file__).parent
ROOT = radharmony_pipeline.__name__
SETTINGS = f"{ROOT}.settings"
# What a lower layer must not import (these modules and their submodules).
ABOVE = ("dagster", *(f"{ROOT}.{name}" for name in ("defs", "operations", "cli", "definitions")))
FORBIDDEN = {f"{ROOT}.sources": ABOVE, f"{ROOT}.processing": ABOVE}


class Import(NamedTuple):
    target: str  # a dotted module name: one of the package's, or another package's
    names: tuple[str, ...]  # the names taken from it (`from target import names`); () if none
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str, source: str, is_package: bool = False) -> list[Import]:
    """Every import statement in `module`'s source, each resolved to the module it loads:
    `from . import name` is the submodule `name` when there is one, else the package."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            target = ".".join(filter(None, (base, node.module)))
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in MODULES:
                    found.append(Import(submodule, (), node.lineno))
                else:
                    found.append(Import(target, (alias.name,), node.lineno))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Import]]:
    """Each module of the package and its imports."""
    return {
        name: imports(name, path.read_text(), path.name == "__init__.py")
        for name, path in MODULES.items()
    }


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_import_cycle_between_the_packages_modules(graph) -> None:
    edges = {
        module: {i.target for i in found if i.target in MODULES} - {module}
        for module, found in graph.items()
    }
    try:
        TopologicalSorter(edges).prepare()
    except CycleError as error:
        # Each module in the cycle found is imported by the next: read backwards.
        pytest.fail(f"import cycle: {' -> '.join(reversed(error.args[1]))}")


def test_no_layer_imports_one_above_it(graph) -> None:
    wrong = [
        f"{module}:{i.line} imports {i.target} {i.names or ''}"
        for module, found in graph.items()
        for layer, above in FORBIDDEN.items()
        if within(module, layer)
        for i in found
        if any(within(i.target, name) for name in above)
        or (i.target == SETTINGS and not all(name.isupper() for name in i.names or ("",)))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_scan_sees_every_kind_of_import(graph) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import dagster as dg\n"
        "from ... import settings\n"
        "from ...settings import DATA_ROOT_VARIABLE, worker_count\n"
        "from .retry_policy import RetryPolicy\n"
        "if TYPE_CHECKING:\n"
        "    from ...defs.resources import OutputsResource\n"
        "def f():\n"
        "    from ...cli import main\n"
    )
    found = imports(f"{ROOT}.processing.storage.store", source)
    assert [(i.target, i.names) for i in found] == [
        ("typing", ("TYPE_CHECKING",)),
        ("dagster", ()),
        (SETTINGS, ()),
        (SETTINGS, ("DATA_ROOT_VARIABLE",)),
        (SETTINGS, ("worker_count",)),
        (f"{ROOT}.processing.storage.retry_policy", ("RetryPolicy",)),
        (f"{ROOT}.defs.resources", ("OutputsResource",)),
        (f"{ROOT}.cli", ("main",)),
    ]
    # A package's own relative imports start from the package itself.
    assert imports(f"{ROOT}.sources", "from .base import X\n", is_package=True)[0].target == (
        f"{ROOT}.sources.base"
    )
    looped = {**graph, SETTINGS: [*graph[SETTINGS], Import(f"{ROOT}.sources", (), 1)]}
    with pytest.raises(pytest.fail.Exception, match=r"import cycle: .*settings -> .*sources"):
        test_no_import_cycle_between_the_packages_modules(looped)
