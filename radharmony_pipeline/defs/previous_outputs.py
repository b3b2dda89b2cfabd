"""A stage's previous tables re-used when its inputs are unchanged.

Each annotation stage and `partition_profile` record a fingerprint of their inputs (their
code version and the states of the files they read: the dataset's metadata, the files of the
tables they are given, which an unchanged re-run does not write again) in their
materialization's metadata. A later run whose fingerprint is the same reads the tables it
wrote back, their checksums verified against the ones the IO manager recorded, instead of
computing them again.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pandas as pd
import pyarrow.parquet as pq

from ..processing.storage.fingerprint import combined_version
from ..processing.storage.output_layout import table_file
from ..processing.storage.source_store import SourcePath, file_state
from ..processing.storage.store import OutputPath, read_bytes
from ..sources import DatasetSource, SourceError
from .io_managers import TABLE_CHECKSUM, read_table_file

# The materialization metadata keys of a stage's input fingerprint, and of whether its
# tables were re-used (True) or computed (False).
INPUT_FINGERPRINT = "input_fingerprint"
REUSED = "reused"


def reuse_marks(fingerprint: str | None, reused: bool) -> dict[str, Any]:
    """The metadata a stage's next run compares (its inputs' fingerprint) and the user reads
    (whether this run re-used the last tables)."""
    return {INPUT_FINGERPRINT: fingerprint, REUSED: reused}


def stage_fingerprint(
    code_version: str,
    partition: str,
    source: DatasetSource,
    split: str,
    input_tables: Sequence[OutputPath] = (),
) -> str | None:
    """What an annotation stage computes its tables from: its code, the image folder the
    paths are relative to, the dataset's metadata and parent files and the files of the
    tables it is given (`input_tables`), by their states: an unchanged table is not written
    again, so its file keeps its state. None when these cannot be named (the stage's read
    reports why)."""
    try:
        files = [*source.annotation_files(split), *source.parent_files()]
        parts = [code_version, partition, str(source.image_dir(split))]
    except SourceError:
        return None
    return files_fingerprint(parts, [*files, *input_tables])


def files_fingerprint(parts: Iterable[str], files: Sequence[SourcePath]) -> str:
    """`parts` (code version, settings) and each file's name, size and modification time
    (an ETag on a store): no file is read, as for the images' keys."""
    states = []
    for path in files:
        try:
            size, version = file_state(path)
            states.append(f"{path}\t{size}\t{version}")
        except OSError:  # absent or unreadable: the stage reports it when it runs
            states.append(f"{path}\tabsent")
    return combined_version([*parts, *states])


def previous_tables(
    context: dg.AssetExecutionContext,
    assets: Sequence[str],
    fingerprint: str | None,
    root: Any,
) -> dict[str, tuple[pd.DataFrame, Mapping[str, Any]]] | None:
    """Per asset of `assets`: the table its last materialization of this partition wrote
    and that materialization's metadata, when every one of them recorded
    `fingerprint` and its file still has the recorded checksum; else None (also when there
    is no fingerprint: inputs that cannot be named are read again)."""
    if fingerprint is None:
        return None
    found = {}
    for asset in assets:
        metadata = _latest_metadata(context, asset)
        if metadata is None or _value(metadata.get(INPUT_FINGERPRINT)) != fingerprint:
            return None
        try:
            content = read_bytes(table_file(root, asset, context.partition_key))
        except OSError:
            return None
        if hashlib.sha256(content).hexdigest() != _value(metadata.get(TABLE_CHECKSUM)):
            return None
        found[asset] = (pq.read_table(io.BytesIO(content)).to_pandas(), metadata)
    return found


@dataclass(frozen=True)
class StageOutput:
    """A table a stage writes and the materialization metadata entries the stage writes for
    it itself (declared beside the asset): what a re-use copies from the last run."""

    asset: str
    metadata: tuple[str, ...]


Built = tuple[pd.DataFrame, dict[str, Any]]


def tables_reused_or_built(
    context: dg.AssetExecutionContext,
    outputs: Sequence[StageOutput],
    fingerprint: str | None,
    root: Any,
    build: Callable[[], Mapping[str, Built]],
    still_there: Callable[[Mapping[str, pd.DataFrame]], bool] = lambda tables: True,
) -> dict[str, Built]:
    """The stages' one re-use path: per output, its last table and the metadata it declares,
    when its inputs' `fingerprint` is the one recorded and what the tables name is
    `still_there`; else what `build()` gives. Either way each output's metadata carries the
    re-use marks."""
    names = [output.asset for output in outputs]
    previous = previous_tables(context, names, fingerprint, root)
    if previous is not None and not still_there({name: previous[name][0] for name in names}):
        context.log.info(f"{context.partition_key}: a file the last {names} name is gone")
        previous = None
    if previous is None:
        tables = dict(build())
        for output in outputs:
            _check_declared(output, tables[output.asset][1])
    else:
        context.log.info(f"{context.partition_key}: inputs unchanged, {names} re-used")
        tables = {
            output.asset: (
                previous[output.asset][0],
                {
                    key: value
                    for key, value in previous[output.asset][1].items()
                    if key in output.metadata
                },
            )
            for output in outputs
        }
    for _, metadata in tables.values():
        metadata.update(reuse_marks(fingerprint, previous is not None))
    return tables


def reused_or_built(
    context: dg.AssetExecutionContext,
    output: StageOutput,
    fingerprint: str | None,
    root: Any,
    build: Callable[[], Built],
    still_there: Callable[[pd.DataFrame], bool] = lambda table: True,
) -> Built:
    """`tables_reused_or_built` for a stage with one output."""
    return tables_reused_or_built(
        context,
        [output],
        fingerprint,
        root,
        lambda: {output.asset: build()},
        lambda tables: still_there(tables[output.asset]),
    )[output.asset]


def _check_declared(output: StageOutput, metadata: Mapping[str, Any]) -> None:
    """A metadata entry the stage writes but does not declare would vanish at its next
    re-use: caught when the stage builds, so the declaration cannot drift."""
    undeclared = sorted(set(metadata) - set(output.metadata))
    if undeclared:
        raise ValueError(
            f"`{output.asset}` writes metadata {undeclared} that its StageOutput does not "
            "declare: add them to its `metadata`."
        )


def input_table(root: Any, asset: str, partition: str) -> pd.DataFrame:
    """The partition's table of `asset`, read in the step by a stage that declares it a
    dependency rather than an input (so that a re-used stage does not load it)."""
    file = table_file(root, asset, partition)
    try:
        return read_table_file(file)
    except FileNotFoundError as error:
        raise dg.Failure(
            description=f"{partition}: {file} is missing, so `{asset}` of this partition is not "
            f"materialized. Fix: materialize `{asset}` for {partition} (the `all_stages` job "
            "does), then this asset again."
        ) from error


def _value(entry: Any) -> Any:
    return getattr(entry, "value", entry)


def _latest_metadata(
    context: dg.AssetExecutionContext, asset: str
) -> Mapping[str, dg.MetadataValue] | None:
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(asset), asset_partitions=[context.partition_key]
        ),
        limit=1,
    ).records
    if not records or records[0].asset_materialization is None:
        return None
    return records[0].asset_materialization.metadata
