"""Where a dataset lives: resource config, environment overrides, then the data-root default.

Every location may be a local folder or file, or an object-store URL (`s3://bucket/prefix`);
see processing/storage/source_store.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..processing.storage.retry_policy import DEFAULT_RETRY_POLICY, RetryPolicy
from ..processing.storage.source_store import SourcePath, source_path
from ..settings import DATA_ROOT_VARIABLE, DEFAULT_DATA_ROOT


@dataclass(frozen=True)
class SourceLocation:
    """User-given paths for one dataset; the names are the seed pages' argument names."""

    root: SourcePath | None = None
    base_image_dir: SourcePath | None = None
    csv_path: SourcePath | None = None
    mask_json_path: SourcePath | None = None

    def with_environment(
        self,
        env_vars: Mapping[str, str],
        environ: Mapping[str, str],
        retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
    ) -> SourceLocation:
        """Fill fields not set explicitly from their environment variables."""
        updates = {
            name: source_path(expand_path(environ[var], environ), retry_policy)
            for name, var in env_vars.items()
            if getattr(self, name) is None and environ.get(var)
        }
        return replace(self, **updates)

    @classmethod
    def from_strings(
        cls,
        values: Mapping[str, str | None],
        environ: Mapping[str, str] | None = None,
        retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
    ) -> SourceLocation:
        """Paths from text (resource config), with `~` and `$VARS` of `environ` expanded."""
        known = {f.name for f in fields(cls)}
        return cls(
            **{
                k: source_path(expand_path(v, environ or {}), retry_policy)
                for k, v in values.items()
                if k in known and v
            }
        )


def data_root(
    environ: Mapping[str, str], retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY
) -> SourcePath:
    return source_path(
        expand_path(environ.get(DATA_ROOT_VARIABLE) or DEFAULT_DATA_ROOT, environ), retry_policy
    )


_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def expand_path(text: str, environ: Mapping[str, str]) -> str:
    """`~` (the HOME of `environ`, else the user's) and `$VAR`/`${VAR}` of `environ` expanded,
    as a shell would; an unknown variable is left as written, so the error shows it."""
    expanded = _VARIABLE.sub(
        lambda match: environ.get(match.group(1) or match.group(2), match.group(0)), text
    )
    if expanded == "~" or expanded.startswith("~/"):
        home = environ.get("HOME") or str(Path.home())
        expanded = home + expanded[1:]
    return expanded
