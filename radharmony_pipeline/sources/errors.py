"""Errors raised when a dataset on disk does not match its documented layout or format."""

from __future__ import annotations

from pathlib import Path


class SourceError(ValueError):
    """Base class: the message always names the file and says how to fix it."""


class DatasetLayoutError(SourceError):
    """A dataset root or a required file is missing."""

    def __init__(
        self,
        dataset: str,
        missing: Path,
        env_var: str,
        layout: str,
        detail: str = "",
        nearby: str = "",
    ):
        self.dataset = dataset
        self.missing = missing
        self.env_var = env_var
        self.detail = detail or "required path not found"
        self.nearby = nearby
        message = (
            f"{dataset}: {self.detail}: {missing}\n"
            + (f"Found instead: {nearby}\n" if nearby else "")
            + f"Set {env_var} (or RADHARMONY_DATA_ROOT) to the folder that holds the download.\n"
            f"Expected layout:\n{layout.rstrip()}"
        )
        super().__init__(message)


class MetadataError(SourceError):
    """A metadata file exists but one of its rows or entries cannot be read."""

    def __init__(self, path: Path, where: str, problem: str, fix: str):
        self.path = path
        self.where = where
        super().__init__(f"{path}: {where}: {problem}. {fix}")
