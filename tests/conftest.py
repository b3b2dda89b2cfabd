"""Shared fixtures: tiny synthetic datasets (generated once per session) and Dagster resources."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import generate_datasets

warnings.filterwarnings("ignore", message=".*preview.*", category=Warning)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All four datasets at tiny scale, with a mixed JPG/DICOM MIMIC tree. Do not modify."""
    root = tmp_path_factory.mktemp("tiny") / "data"
    generate_datasets(root, scale="tiny", seed=7, mimic_format="mixed")
    return root


@pytest.fixture
def tiny_copy(tiny_root: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny datasets that a test may break."""
    copy = tmp_path / "data"
    shutil.copytree(tiny_root, copy)
    return copy


@pytest.fixture
def open_tiny(tiny_root: Path):
    """Open a dataset's reader on the tiny data, ignoring the caller's environment."""

    def opener(dataset: str, root: Path | None = None, **location):
        environ = {"RADHARMONY_DATA_ROOT": str(root or tiny_root)}
        return open_source(dataset, SourceLocation(**location), environ)

    return opener


@pytest.fixture(scope="session")
def tiny_corpus(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every partition of the tiny data materialized with its checks, then the manifest: built
    once per session for every module that only reads outputs (a rebuild costs seconds per
    partition; `tiny_corpus_copy` gives a test a private copy to change or rebuild on).

    Returns (output root, {partition: result}, manifest result). Do not modify the files.
    """
    from corpus import materialize_corpus

    output = tmp_path_factory.mktemp("tiny-corpus")
    return output, *materialize_corpus(tiny_root, output)


@pytest.fixture
def tiny_corpus_copy(tiny_corpus, tmp_path: Path) -> Path:
    """A private copy of the tiny corpus's outputs (file times kept, as a rerun sees them)."""
    copy = tmp_path / "output"
    shutil.copytree(tiny_corpus[0], copy)
    return copy
