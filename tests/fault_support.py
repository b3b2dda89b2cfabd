"""Helpers of the fault-injection suite: build stages on sabotaged copies, compare with a clean
run, prove nothing outside the dataset roots was opened, and load every written file."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
from PIL import Image

from radharmony_pipeline.definitions import defs
from radharmony_pipeline.defs.assets.source_files import source_files
from radharmony_pipeline.defs.groups import PARTITION_STAGES
from radharmony_pipeline.defs.resources import DatasetsResource, pipeline_resources
from radharmony_pipeline.defs.run_settings import RunSettingsResource
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.processing.tables.table_schemas import PARTITION_TABLES

TABLES = PARTITION_TABLES
STAGES = PARTITION_STAGES
# Every build of a tiny partition finishes well within this, hostile input or not: a test
# that builds bounds itself by pytest-timeout at this per build (a hang fails, not stalls).
BUILD_SECONDS = 120
_ASSETS = [d for d in defs.assets if not isinstance(d, dg.SourceAsset) and d is not source_files]
_KEYS = {
    "raw_index": ["image_id"],
    "labels": ["image_id"],
    "masks": ["image_id", "mask_class"],
    "bboxes": ["image_id", "box_index"],
    "images": ["image_id"],
}


def build(
    data_root: Path, output: Path, partition: str, strict: bool = False, checks: bool = False
) -> dg.ExecuteInProcessResult:
    """Materialize every stage of one partition (and its checks when asked), within bounds."""
    resources = {
        **pipeline_resources(data_root, output),
        "datasets": DatasetsResource(data_root=str(data_root)),
        "run_settings": RunSettingsResource(strict=strict),
    }
    assets = [*_ASSETS, *defs.asset_checks] if checks else _ASSETS
    result = dg.materialize(
        assets,
        partition_key=partition,
        resources=resources,
        # In-step checks (check_specs) belong to their assets: deselected unless asked for.
        selection=STAGES if checks else STAGES.without_checks(),
        raise_on_error=False,
    )
    return result


def tables(output: Path, partition: str) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(layout.table_file(output, name, partition)) for name in TABLES}


def packed_rows(output: Path, partition: str, images: pd.DataFrame) -> dict[str, bytes]:
    """Each ok image's row of the packed array, by image_id."""
    packed = np.load(output / layout.packed_images(partition))
    ok = images[images["status"] == "ok"]
    return {
        image_id: packed[row].tobytes()
        for image_id, row in zip(ok["image_id"], ok["tensor_index"], strict=True)
    }


def assert_other_rows_identical(
    clean: dict[str, pd.DataFrame], faulty: dict[str, pd.DataFrame], affected: set[str]
) -> None:
    """Every row of an image outside `affected` equals the clean run's row (row positions in
    the packed array may move when a study collapses into one error row; pixels may not)."""
    for name in TABLES:
        keys = _KEYS[name]
        columns = [c for c in clean[name].columns if c != "tensor_index"]
        left, right = (
            frame.loc[~frame["image_id"].isin(affected), columns]
            .sort_values(keys)
            .reset_index(drop=True)
            for frame in (clean[name], faulty[name])
        )
        pd.testing.assert_frame_equal(left, right, obj=name)


def error_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "error"]


def assert_error_row(frame: pd.DataFrame, image_id: str, *parts: str) -> str:
    """The image's error row exists and its reason names every part (file, entry, field)."""
    rows = error_rows(frame)
    rows = rows[rows["image_id"] == image_id]
    assert len(rows) >= 1, f"no error row for {image_id}: {error_rows(frame)['error'].tolist()}"
    message = rows["error"].iloc[0]
    for part in parts:
        assert str(part) in message, f"{part!r} not in {message!r}"
    return message


def output_files(root: Path, folder: Path | None = None) -> dict[str, bytes]:
    """Every file under `folder` (by default the whole root) by its path relative to `root`,
    but the header records: they hold the PNGs' mtimes and inodes, so two roots differ there
    by design (test_incremental_reruns checks what they record)."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in (folder or root).rglob("*")
        if path.is_file() and not path.name.endswith(layout.PACKED_HEADERS_SUFFIX)
    }


def assert_same_outputs(remote: dict[str, bytes], local: dict[str, bytes]) -> None:
    """The same files (by relative path): tables equal as frames, arrays as arrays, the rest
    byte for byte."""
    assert sorted(remote) == sorted(local)
    for name, data in local.items():
        if name.endswith(".parquet"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(io.BytesIO(remote[name])), pd.read_parquet(io.BytesIO(data))
            )
        elif name.endswith(".npy"):
            np.testing.assert_array_equal(
                np.load(io.BytesIO(remote[name])), np.load(io.BytesIO(data)), err_msg=name
            )
        else:  # PNGs (masks, images, previews) and key files: the very same bytes
            assert remote[name] == data, name


def assert_outputs_load(output: Path) -> None:
    """No temporary file is left, and every Parquet, PNG and .npy written loads."""
    leftovers = [p for p in output.rglob("*") if TEMP_MARKER in p.name]
    assert leftovers == []
    for path in output.rglob("*"):
        if path.suffix == ".parquet":
            pd.read_parquet(path)
        elif path.suffix == ".png":
            with Image.open(path) as image:
                image.load()
        elif path.suffix == ".npy":
            np.load(path)


class OpenAudit:
    """Records files opened in this process whose real path lies under a forbidden folder,
    and access times of the sentinel files there (which also catch other processes)."""

    def __init__(self, forbidden: Path):
        self.forbidden = os.path.realpath(forbidden)
        self.opened: list[str] = []
        self._atimes: dict[Path, float] = {}

    def hook(self, event: str, args: tuple) -> None:
        if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        try:
            real = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        if real.startswith(self.forbidden + os.sep):
            self.opened.append(real)

    def arm_sentinels(self) -> None:
        """Set every forbidden file's access time before its modification time, so that any
        read (with the usual relatime mount) moves it forward."""
        for path in Path(self.forbidden).rglob("*"):
            if path.is_file():
                stat = path.stat()
                os.utime(path, (stat.st_mtime - 3600, stat.st_mtime))
                self._atimes[path] = path.stat().st_atime

    def read_sentinels(self) -> list[Path]:
        return [path for path, atime in self._atimes.items() if path.stat().st_atime != atime]


_AUDITS: list[OpenAudit] = []


def _dispatch(event: str, args: tuple) -> None:
    # Audit hooks cannot be removed: one hook forwards to the audits active right now.
    for audit in _AUDITS:
        audit.hook(event, args)


sys.addaudithook(_dispatch)


@contextmanager
def nothing_opened_under(forbidden: Path) -> Iterator[OpenAudit]:
    """Fail unless no file under `forbidden` is opened (here) or read (anywhere) in the block."""
    audit = OpenAudit(forbidden)
    audit.arm_sentinels()
    assert audit._atimes, "the forbidden folder needs sentinel files"
    _AUDITS.append(audit)
    try:
        yield audit
    finally:
        _AUDITS.remove(audit)
    assert audit.opened == []
    assert audit.read_sentinels() == []


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    """The first failed step's error with its causes (Dagster wraps what the step raised)."""
    failures = [event for event in result.all_events if event.is_step_failure]
    assert failures, "the run did not fail"
    error, messages = failures[0].step_failure_data.error, []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    return "\n".join(messages)
