"""Hostile input that once stalled or crashed a partition: a FIFO, socket, device or folder
in place of an image is an error row and is never opened; an annotation file without entries
gives an empty partition, typed like any other, that fails its count check with expected vs
found."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from fault_support import (
    assert_error_row,
    assert_other_rows_identical,
    assert_outputs_load,
    build,
    error_rows,
    tables,
)

from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.processing.tables import table_schemas
from radharmony_pipeline.processing.tables.table_schemas import PARTITION_TABLES
from radharmony_pipeline.settings import UNREADABLE_LIMIT_VARIABLE

pytestmark = pytest.mark.build  # each test builds partitions from sabotaged data

NOT_OPENED = "not a regular file; it was not opened"


class FifoWatch:
    """Proves nobody opened a FIFO for reading: a writer can open a FIFO without blocking
    only while a reader holds it, so a thread keeps trying until stopped."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.opened: list[Path] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            for path in self.paths:
                try:
                    descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as error:
                    assert error.errno == errno.ENXIO, error  # no reader: as it must be
                    continue
                self.opened.append(path)
                os.close(descriptor)

    def __enter__(self) -> FifoWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def replace_with_fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def replace_with_socket(path: Path) -> socket.socket:
    path.unlink()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    return server


def replace_with_device(path: Path) -> None:
    """A character device node (the null device's numbers); needs root, as the tests run."""
    path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


def replace_with_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside.png").write_bytes(b"not an image")


@pytest.fixture(scope="module")
def clean_builds(tiny_root, tmp_path_factory):
    """The two partitions this module sabotages, built from untouched data."""
    built = {}
    for partition in ("chestx_det.train", "ms_cxr.train"):
        output = tmp_path_factory.mktemp("clean") / "out"
        assert build(tiny_root, output, partition).success
        built[partition] = tables(output, partition)
    return built


@pytest.mark.timeout(240)
def test_special_files_in_place_of_images_are_error_rows_never_opened(
    clean_builds, tiny_copy, tmp_path
):
    partition = "chestx_det.train"
    clean = clean_builds[partition]
    folder = tiny_copy / "chestx-det" / "train"
    rows = clean["raw_index"].iloc[:4]
    paths = [folder / relative for relative in rows["image_path"]]
    fifo = replace_with_fifo(paths[0])
    server = replace_with_socket(paths[1])
    replace_with_device(paths[2])
    replace_with_folder(paths[3])
    output = tmp_path / "out"
    try:
        with FifoWatch([fifo]) as watch:
            result = build(tiny_copy, output, partition)
    finally:
        server.close()
    assert watch.opened == []
    assert result.success
    built = tables(output, partition)
    kinds = ["named pipe (FIFO)", "socket", "character device", "folder"]
    for image_id, path, kind in zip(rows["image_id"], paths, kinds, strict=True):
        message = assert_error_row(built["images"], image_id, str(path), kind, NOT_OPENED)
        assert "Replace it with the file itself" in message
    assert set(error_rows(built["images"])["image_id"]) == set(rows["image_id"])
    # The masks come from the polygons, not the pixels: those rows equal the clean ones.
    assert_other_rows_identical(clean, built, set(rows["image_id"]))
    assert_outputs_load(output)
    assert not [p for p in output.rglob("*") if ".partial" in p.name]


@pytest.mark.timeout(240)
def test_a_fifo_dicom_in_the_mimic_tree_is_an_error_row_of_every_stage_reading_it(
    clean_builds, tiny_copy, tmp_path
):
    partition = "ms_cxr.train"
    clean = clean_builds[partition]
    index = clean["raw_index"]
    row = index[index["image_format"] == "dcm"].iloc[0]
    fifo = replace_with_fifo(tiny_copy / "mimic-cxr" / "files" / row["image_path"])
    output = tmp_path / "out"
    with FifoWatch([fifo]) as watch:
        result = build(tiny_copy, output, partition)
    assert watch.opened == []
    assert result.success
    built = tables(output, partition)
    assert_error_row(built["images"], row["image_id"], str(fifo), "named pipe (FIFO)", NOT_OPENED)
    assert_outputs_load(output)


# --- annotation files without entries ---------------------------------------------------------

HEADER_ONLY = "header-only"
# (partition, annotation file, contents that hold no entries, documented images of the split)
EMPTY_ANNOTATIONS = [
    ("chestx_det.test", "chestx-det/ChestX_Det_test.json", "[]"),
    ("chestx_det.test", "chestx-det/ChestX_Det_test.json", "{}"),
    ("chestx_det.test", "chestx-det/ChestX_Det_test.json", ""),
    ("chestx_det.train", "chestx-det/ChestX_Det_train.json", " \n"),
    ("chexlocalize.val", "chexlocalize/CheXpert/val_labels.csv", HEADER_ONLY),
    ("chexlocalize.val", "chexlocalize/CheXpert/val_labels.csv", ""),
    ("chexlocalize.test", "chexlocalize/CheXlocalize/gt_segmentations_test.json", "{}"),
    ("chexlocalize.test", "chexlocalize/CheXlocalize/gt_segmentations_test.json", "[]"),
    ("chexlocalize.test", "chexlocalize/CheXlocalize/gt_segmentations_test.json", ""),
    ("ms_cxr.val", "ms-cxr/MS_CXR_Local_Alignment_v1.1.0.csv", HEADER_ONLY),
    ("ms_cxr.val", "ms-cxr/MS_CXR_Local_Alignment_v1.1.0.csv", ""),
    ("rexgradient.test", "rexgradient/download/metadata/test_metadata_view_position.json", "{}"),
    ("rexgradient.test", "rexgradient/download/metadata/test_metadata_view_position.json", "[]"),
    ("rexgradient.val", "rexgradient/download/metadata/valid_metadata_view_position.json", ""),
]


def empty(path: Path, content: str) -> None:
    if content == HEADER_ONLY:
        content = path.read_text().splitlines()[0] + "\n"
    path.write_text(content)


def assert_declared_schema(output: Path, table: str, partition: str) -> None:
    declared = getattr(table_schemas, table.upper()).arrow()
    written = pq.read_schema(layout.table_file(output, table, partition))
    assert written.names == declared.names
    assert [f.type for f in written] == [f.type for f in declared], table


@pytest.mark.timeout(600)
def test_an_annotation_file_without_entries_gives_an_empty_typed_partition(
    tiny_root, tmp_path, monkeypatch
):
    # The copies leave the JPEG and DICOM images out (only the annotations matter here), so a
    # partition of them is not failed for its missing images.
    monkeypatch.setenv(UNREADABLE_LIMIT_VARIABLE, "1")
    for number, (partition, relative, content) in enumerate(EMPTY_ANNOTATIONS):
        data = tmp_path / f"data{number}"
        shutil.copytree(tiny_root, data, ignore=shutil.ignore_patterns("*.jpg", "*.dcm"))
        empty(data / relative, content)
        output = tmp_path / f"out{number}"
        case = f"{relative} as {content!r}"

        result = build(data, output, partition, checks=True)

        failures = [e.step_failure_data.error for e in result.all_events if e.is_step_failure]
        assert len(failures) == 1, case
        assert "SchemaMismatchError" not in str(failures[0].to_string()), case
        counts = [
            c
            for c in result.get_asset_check_evaluations()
            if c.check_name == "counts_match_documentation"
        ]
        assert len(counts) == 1 and not counts[0].passed, case
        described = counts[0].description
        expected = counts[0].metadata["mismatches"].value
        metric = "images" if "images" in expected else "images_with_segmentation"
        assert expected[metric]["found"] == 0 and expected[metric]["expected"] > 0, case
        assert f"{metric}: expected {expected[metric]['expected']}, found 0" in described, case
        assert "found None" not in described, case
        for table in ("raw_index", "labels"):
            assert_declared_schema(output, table, partition)
        if metric == "images":  # the whole split is empty, not only its masks
            assert len(tables_of(output, partition, "raw_index")) == 0, case
        assert_outputs_load(output)


def tables_of(output: Path, partition: str, table: str):
    return pq.read_table(layout.table_file(output, table, partition))


@pytest.mark.timeout(300)
def test_every_stage_of_an_empty_partition_writes_typed_empty_tables(tiny_root, tmp_path):
    """Without the blocking check (e.g. when it is deselected) the later stages run on the
    empty partition too and write empty tables of their declared schema."""
    data = tmp_path / "data"
    shutil.copytree(tiny_root, data, ignore=shutil.ignore_patterns("*.jpg", "*.dcm"))
    empty(data / "chestx-det" / "ChestX_Det_test.json", "[]")
    output = tmp_path / "out"
    assert build(data, output, "chestx_det.test").success
    for table in PARTITION_TABLES:
        assert_declared_schema(output, table, "chestx_det.test")
        assert len(tables_of(output, "chestx_det.test", table)) == 0
    assert_outputs_load(output)
