"""The documents name only things that exist: every backticked repository path and every
backticked dotted or `module:name` name of the package in README.md and docs/*.md resolves.

What counts as a reference (everything else in backticks is prose, a command or a pattern):
- a path: a span with a `/` or a file suffix (`.py`, `.md`, `.yaml`, …) whose first part is an
  entry of the repository, the package or the document's folder, or that names a `.py` file;
  spans with spaces, a URL scheme or a pattern character (`<partition>`, `{val,test}`, `*`, `~`,
  `…`) are not paths, and neither are paths under a folder .gitignore ignores (outputs, data);
- a name: identifiers joined by `.` or `:` whose first part is `radharmony_pipeline` or the name
  of one of its modules or packages (`processing.imaging.decode`, `image_jobs.ImageJob`,
  `radharmony_pipeline.cli:main`); other names (`np.unique`, `dg.asset`) are not the package's,
  and a partition key (`chexlocalize.test`: its last part one of vocabulary.SPLITS) is data.

Names are resolved by reading the package's source (no import): the longest leading run of
parts that names a module, then a top-level name of it, then a member of that class. Links to
other documents (`[text](docs/outputs.md#a-heading)`) must reach an existing file and heading.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
PACKAGE = REPOSITORY / "radharmony_pipeline"
DOCUMENTS = (REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md")))

# Source, document and data suffixes: `corpus.png` is a file, not the name `png` in `corpus`.
FILE_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh"} | {
    ".json",
    ".csv",
    ".gz",
    ".png",
    ".jpg",
    ".dcm",
    ".parquet",
    ".npy",
    ".tar",
}
PATTERN_CHARACTERS = set("<>{}*~$…") | {" ", "\t"}
NAME = re.compile(r"[A-Za-z_]\w*(?:[.:][A-Za-z_]\w*)+")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """A Markdown text without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.DOTALL | re.MULTILINE)


def inline_code(markdown: str) -> list[str]:
    """The backticked spans of a Markdown text, outside fenced code blocks."""
    return [span.strip() for span in INLINE_CODE.findall(prose(markdown))]


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces
    as hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", prose(markdown), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def broken_links(markdown: str, document: Path) -> list[str]:
    """Relative links of a document whose file or heading does not exist."""
    broken = []
    for target in LINK.findall(prose(markdown)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        linked = (document.parent / file).resolve() if file else document
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text())
        ):
            broken.append(target)
    return broken


@functools.cache
def ignored_folders() -> frozenset[str]:
    """Folder names .gitignore ignores outright (`data/`, `.venv/`): generated, not the repo's."""
    lines = (REPOSITORY / ".gitignore").read_text().splitlines()
    return frozenset(
        line.strip().strip("/") for line in lines if re.fullmatch(r"[\w.-]+/", line.strip())
    )


@functools.cache
def modules() -> dict[str, Path]:
    """Every module and package of the package by dotted name (`processing.imaging.decode`)."""
    found = {"radharmony_pipeline": PACKAGE / "__init__.py"}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if dotted:
            found[dotted] = path
            found[f"radharmony_pipeline.{dotted}"] = path
    return found


@functools.cache
def module_short_names() -> frozenset[str]:
    return frozenset(name.rsplit(".", 1)[-1] for name in modules())


@functools.cache
def top_level(path: Path) -> dict[str, ast.AST]:
    """The names a module binds at top level: functions, classes, assignments, imports."""
    return names_bound_in(ast.parse(path.read_text(), filename=str(path)).body)


def names_bound_in(body: list[ast.stmt]) -> dict[str, ast.AST]:
    bound: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        bound[name.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):  # e.g. names bound under TYPE_CHECKING
            bound.update(names_bound_in(node.body))
    return bound


def name_exists(name: str) -> bool:
    """Whether a dotted or `module:name` name of the package names something in its source."""
    parts = re.split(r"[.:]", name)
    for length in range(len(parts), 0, -1):
        candidates = [
            path
            for dotted, path in modules().items()
            if dotted == ".".join(parts[:length]) or dotted.endswith("." + ".".join(parts[:length]))
        ]
        if candidates:
            return any(member_exists(path, parts[length:]) for path in candidates)
    return False


def member_exists(module: Path, names: list[str]) -> bool:
    """Whether `names` are a top-level name of the module, then a member of that class (a
    member of anything else cannot be read from the source and is taken as it is)."""
    if not names:
        return True
    node = top_level(module).get(names[0])
    if node is None:
        return False
    if isinstance(node, ast.ClassDef) and len(names) > 1:
        return names[1] in names_bound_in(node.body)
    return True


def is_path(span: str) -> bool:
    return "/" in span or Path(span).suffix in FILE_SUFFIXES


def is_repository_path(span: str, folder: Path) -> bool:
    if PATTERN_CHARACTERS & set(span) or "://" in span:
        return False
    first = span.removeprefix("./").split("/", 1)[0]
    if first in ignored_folders():
        return False
    roots = (REPOSITORY, PACKAGE, folder)
    return span.endswith(".py") or any((root / first).exists() for root in roots if first)


def path_exists(span: str, folder: Path) -> bool:
    relative = span.removeprefix("./")
    if any((root / relative).exists() for root in (REPOSITORY, PACKAGE, folder)):
        return True
    if "/" not in relative and relative.endswith(".py"):  # a module named by its file alone
        return any(path.name == relative for path in PACKAGE.rglob("*.py")) or any(
            (REPOSITORY / folder_name / relative).exists()
            for folder_name in ("tests", "benchmarks")
        )
    # `processing/jobs/image_jobs.build_packed_images`: a module's path, then a name in it.
    dotted = relative.strip("/").removesuffix(".py").replace("/", ".")
    return (
        not relative.endswith((".py", "/"))
        and NAME.fullmatch(dotted) is not None
        and name_exists(dotted)
    )


@functools.cache
def splits() -> tuple[str, ...]:
    return ast.literal_eval(top_level(PACKAGE / "vocabulary.py")["SPLITS"].value)


def is_package_name(span: str) -> bool:
    parts = re.split(r"[.:]", span)
    return (
        NAME.fullmatch(span) is not None
        and parts[0] in module_short_names() | {"radharmony_pipeline"}
        and parts[-1] not in splits()
    )


def broken_references(markdown: str, folder: Path) -> list[str]:
    """The backticked references of a document that name nothing in the repository."""
    broken = []
    for span in inline_code(markdown):
        if is_path(span):
            if is_repository_path(span, folder) and not path_exists(span, folder):
                broken.append(span)
        elif is_package_name(span) and not name_exists(span):
            broken.append(span)
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_reference_in_the_document_exists(document):
    assert broken_references(document.read_text(), document.parent) == []
    assert broken_links(document.read_text(), document) == []


def test_a_link_to_a_missing_file_or_heading_is_reported():
    text = """See [tables](tables.md), [loading](outputs.md#loading-it-in-a-training-loop),
    [the UI](../README.md#the-ui), [upstream](https://docs.dagster.io/), and the stale
    [cluster](../README.md#running-on-a-cluster), [gone](no-such-page.md), [x](tables.md#nope).
    """
    assert broken_links(text, REPOSITORY / "docs" / "design-notes.md") == [
        "../README.md#running-on-a-cluster",
        "no-such-page.md",
        "tables.md#nope",
    ]


def test_a_renamed_or_missing_reference_is_reported():
    text = """
    Decoding is `processing/imaging/decode.py` (`processing.imaging.decode.decode_grayscale`),
    the jobs `processing/jobs/image_jobs.build_packed_images`, the command
    `radharmony_pipeline.cli:main`, the registry `sources.SOURCE_TYPES`, a method
    `image_jobs.ImageJob.current_row`, the docs `docs/cluster.md` and `cluster.md`.
    Stale: `processing/perceptual_hash.group_fingerprints`, `tagged_png.PNG_OPTIONS`,
    `processing/image_jobs`, `processing.imaging.no_such_module`, `decode.no_such_function`,
    `radharmony_pipeline.cli:no_main`, `image_jobs.ImageJob.no_method`, `no_such_file.py`,
    `docs/no-such-page.md`, `tests/test_no_such_module.py`.
    """
    assert broken_references(text, REPOSITORY / "docs") == [
        "processing/perceptual_hash.group_fingerprints",
        "tagged_png.PNG_OPTIONS",
        "processing/image_jobs",
        "processing.imaging.no_such_module",
        "decode.no_such_function",
        "radharmony_pipeline.cli:no_main",
        "image_jobs.ImageJob.no_method",
        "no_such_file.py",
        "docs/no-such-page.md",
        "tests/test_no_such_module.py",
    ]


def test_what_is_not_a_repository_reference_is_left_alone():
    text = """
    Outputs `data/output/tables/labels/x.parquet` and `<output>/tables/<asset>/<partition>.parquet`,
    downloads `chexlocalize/CheXpert/{val,test}/`, `train_data/train/`, `deid_png/`,
    `ChestX_Det_train.json`, `~/cxr-downloads`, a URL `s3://bucket/prefix/`, a command
    `dg launch --job all_stages`, other libraries' names `np.unique`, `dg.AssetSelection`,
    files a run writes: `DATASET_CARD.md`, `croissant.json`, `corpus.png`, and a partition key
    `chexlocalize.test`.
    ```
    processing/not/checked/inside/a/fenced/block.py
    ```
    """
    assert broken_references(text, REPOSITORY / "docs") == []
