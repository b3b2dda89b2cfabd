"""ManifestDataset over a tiny hand-built output tree: samples, filters, labels and memmaps."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from radharmony_pipeline import loader
from radharmony_pipeline.loader import ManifestDataset
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.vocabulary import LABEL_COLUMNS

S = 16

# Unified labels that are not null per image; every other label column is null.
KNOWN_LABELS = {
    "chestx_det/a": {"label_nodule": 1, "label_mass": 0, "label_pleural_effusion": 1},
    "chestx_det/b": {"label_nodule": 0, "label_mass": 0, "label_pleural_effusion": 0},
    "ms_cxr/c": {"label_consolidation": 1},
    "ms_cxr/d": {},
}


def entry(image_id, split, view_position, tensor_index, has_mask, boxes, labels, report=None):
    """An image's manifest fields here (its dataset and partition follow from id and split)."""
    dataset = image_id.split("/")[0]
    return dict(
        image_id=image_id,
        dataset=dataset,
        split=split,
        view_position=view_position,
        partition=f"{dataset}.{split}",
        tensor_index=tensor_index,
        has_mask=has_mask,
        bboxes_resized=boxes,
        bbox_labels=labels,
        report=report,
    )


# One row per image, in manifest order. ms_cxr's tensor rows run opposite to the manifest's,
# so reading the manifest position instead of `tensor_index` picks the wrong picture.
BOXES_OF_A = [[0.25, 0.5, 0.125, 0.375], [0.5, 0.75, 0.5, 1.0]]
REPORT_OF_C = "Patchy consolidation in the left lower lobe."
ROWS = [
    entry("chestx_det/a", "train", "PA", 0, True, BOXES_OF_A, ["nodule", "pleural_effusion"]),
    entry("chestx_det/b", "train", "AP", 1, True, [], []),
    entry(
        "ms_cxr/c", "test", "PA", 1, False, [[0.1, 0.4, 0.2, 0.6]], ["consolidation"], REPORT_OF_C
    ),
    entry("ms_cxr/d", "test", "LATERAL", 0, False, None, None),  # null lists, not empty ones
]
IDS = [row["image_id"] for row in ROWS]


def image_pixels(position: int) -> np.ndarray:
    """Distinct uint8 pictures that include both extremes, 0 and 255."""
    pixels = np.random.default_rng(position).integers(0, 256, (S, S), dtype=np.uint8)
    pixels[0, 0], pixels[-1, -1] = 0, 255
    return pixels


def union_mask(position: int) -> np.ndarray:
    """0/255 on disk, as the images stage writes it; image b has an all-zero union."""
    mask = np.zeros((S, S), dtype=np.uint8)
    if position == 0:
        mask[4:8, 2:6] = 255
    return mask


def write_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def write_images(output: Path) -> list[dict]:
    """Resized PNGs, union masks and one packed array per partition; manifest path columns."""
    packed: dict[str, dict[int, np.ndarray]] = {}
    paths = []
    for position, row in enumerate(ROWS):
        key = row["image_id"].replace("/", "_")
        image_path = layout.resized_image(row["partition"], key)
        write_png(output / image_path, image_pixels(position))
        mask_path = None
        if row["has_mask"]:
            mask_path = f"masks_resized/{row['partition']}/{key}.png"
            write_png(output / mask_path, union_mask(position))
        tensor_path = f"tensors/{row['partition']}.npy"
        packed.setdefault(tensor_path, {})[row["tensor_index"]] = image_pixels(position)
        paths.append(dict(image_path=image_path, mask_path=mask_path, tensor_path=tensor_path))
    for tensor_path, rows in packed.items():
        (output / tensor_path).parent.mkdir(parents=True, exist_ok=True)
        np.save(output / tensor_path, np.stack([rows[index] for index in sorted(rows)]))
    return paths


def manifest_table(paths: list[dict]) -> pa.Table:
    boxes = pa.list_(pa.list_(pa.float64()))
    strings = pa.list_(pa.string())
    columns = {
        "image_id": (pa.string(), IDS),
        "dataset": (pa.string(), [row["dataset"] for row in ROWS]),
        "split": (pa.string(), [row["split"] for row in ROWS]),
        "patient_id": (pa.string(), [f"p{n}" for n in range(len(ROWS))]),
        "study_id": (pa.string(), [f"s{n}" for n in range(len(ROWS))]),
        "view_position": (pa.string(), [row["view_position"] for row in ROWS]),
        "source_image_path": (pa.string(), [f"src/{n}.png" for n in range(len(ROWS))]),
        "image_path": (pa.string(), [p["image_path"] for p in paths]),
        "tensor_path": (pa.string(), [p["tensor_path"] for p in paths]),
        "tensor_index": (pa.int64(), [row["tensor_index"] for row in ROWS]),
        "orig_height": (pa.int64(), [1024] * len(ROWS)),
        "orig_width": (pa.int64(), [1024] * len(ROWS)),
        "mask_path": (pa.string(), [p["mask_path"] for p in paths]),
        "has_mask": (pa.bool_(), [row["has_mask"] for row in ROWS]),
        "mask_classes": (strings, [["nodule"], [], [], []]),
        "bboxes": (boxes, [row["bboxes_resized"] for row in ROWS]),
        "bboxes_resized": (boxes, [row["bboxes_resized"] for row in ROWS]),
        "bbox_labels": (strings, [row["bbox_labels"] for row in ROWS]),
        "label_text": (strings, [[], [], ["patchy consolidation"], []]),
        "report": (pa.string(), [row["report"] for row in ROWS]),
        **{
            column: (pa.int8(), [KNOWN_LABELS[image_id].get(column) for image_id in IDS])
            for column in LABEL_COLUMNS
        },
        "patient_sex": (pa.string(), [None, None, "F", "M"]),
        "patient_age_years": (pa.float64(), [None, None, 61.0, 47.0]),
        "study_date": (pa.string(), [None] * len(ROWS)),
    }
    return pa.table({name: pa.array(values, type=kind) for name, (kind, values) in columns.items()})


@pytest.fixture
def output_root(tmp_path: Path) -> Path:
    output = tmp_path / "output"
    table = manifest_table(write_images(output))
    layout.tables_folder(output).mkdir(parents=True)
    pq.write_table(table, output / layout.MANIFEST)
    return output


@pytest.fixture(autouse=True)
def numpy_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the numpy samples; the torch path has its own test below, so the
    suite behaves the same with or without torch installed."""
    monkeypatch.setattr(loader, "torch", None)


@pytest.fixture
def manifest_path(output_root: Path) -> Path:
    return output_root / layout.MANIFEST


@pytest.fixture
def dataset(manifest_path: Path) -> ManifestDataset:
    # No output_root: it must default to the manifest's grandparent folder.
    return ManifestDataset(manifest_path)


def test_samples_have_the_training_shapes_and_dtypes(dataset):
    assert len(dataset) == len(ROWS)
    for position, sample in enumerate(dataset):
        img, mask = sample["img"], sample["mask"]
        assert img.shape == (1, S, S) and img.dtype == np.float32
        assert mask.shape == (1, S, S) and mask.dtype == np.float32
        assert img.min() == -1.0 and img.max() == 1.0  # pixels 0 and 255 are in every image
        np.testing.assert_allclose(img[0], image_pixels(position) / 127.5 - 1, atol=1e-6)
        assert set(np.unique(mask)) <= {0.0, 1.0}
        assert (sample["image_id"], sample["dataset"], sample["split"]) == (
            ROWS[position]["image_id"],
            ROWS[position]["dataset"],
            ROWS[position]["split"],
        )


def test_union_mask_comes_back_as_zero_one(dataset):
    np.testing.assert_array_equal(dataset[0]["mask"][0], union_mask(0) / 255)
    assert dataset[0]["mask"].sum() == 16
    assert not dataset[1]["mask"].any()  # all-zero union mask
    assert not dataset[3]["mask"].any()  # no mask at all


def test_packed_and_png_reads_give_identical_images(manifest_path):
    packed = ManifestDataset(manifest_path, use_packed=True)
    png = ManifestDataset(manifest_path, use_packed=False)
    for position in range(len(ROWS)):
        np.testing.assert_array_equal(packed[position]["img"], png[position]["img"])


def test_packed_array_is_read_when_present(output_root, manifest_path):
    for row in ROWS:
        key = row["image_id"].replace("/", "_")
        (output_root / layout.resized_image(row["partition"], key)).unlink()
    dataset = ManifestDataset(manifest_path)
    np.testing.assert_allclose(dataset[2]["img"][0], image_pixels(2) / 127.5 - 1, atol=1e-6)


def test_png_is_read_when_the_packed_array_is_missing(output_root, manifest_path):
    (output_root / "tensors" / "ms_cxr.test.npy").unlink()
    dataset = ManifestDataset(manifest_path)
    np.testing.assert_allclose(dataset[3]["img"][0], image_pixels(3) / 127.5 - 1, atol=1e-6)


def test_packed_arrays_are_read_row_by_row_with_one_header_read_per_file(dataset, monkeypatch):
    """A sample reads its one row, never the whole array (a map grows a training process to
    the array's size over an epoch); each array's header is read once."""
    import radharmony_pipeline.loader as loader

    headers = []
    real_read_layout = loader.read_layout

    def counting_read_layout(path):
        headers.append(Path(path).name)
        return real_read_layout(path)

    monkeypatch.setattr(loader, "read_layout", counting_read_layout)
    for _ in range(3):
        for position in range(len(dataset)):
            dataset[position]
    assert sorted(headers) == ["chestx_det.train.npy", "ms_cxr.test.npy"]
    for reader in dataset._packed.values():
        row_bytes = reader.rows.layout.row_bytes
        assert reader.rows.reads and set(reader.rows.reads) == {row_bytes}


def test_class_vector_keeps_unknown_apart_from_negative(dataset):
    for position, image_id in enumerate(IDS):
        cls = dataset[position]["cls"]
        assert cls.shape == (len(LABEL_COLUMNS),) and cls.dtype == np.float32
        known = KNOWN_LABELS[image_id]
        for column, value in zip(LABEL_COLUMNS, cls, strict=True):
            if column in known:
                assert value == known[column], (image_id, column)
            else:
                assert np.isnan(value), (image_id, column)


def test_class_vector_follows_vocabulary_order(dataset):
    cls = dataset[2]["cls"]
    assert np.flatnonzero(~np.isnan(cls)).tolist() == [LABEL_COLUMNS.index("label_consolidation")]


def test_missing_report_stays_none(dataset):
    assert dataset[3]["report"] is None
    assert dataset[2]["report"] == "Patchy consolidation in the left lower lobe."


def test_boxes_are_n_by_4_in_the_resized_frame(dataset):
    first = dataset[0]
    assert first["bboxes"].dtype == np.float32
    np.testing.assert_allclose(first["bboxes"], ROWS[0]["bboxes_resized"])
    assert first["bbox_labels"] == ["nodule", "pleural_effusion"]
    for empty in (dataset[1], dataset[3]):  # an empty list and a null
        assert empty["bboxes"].shape == (0, 4) and empty["bboxes"].dtype == np.float32
        assert empty["bbox_labels"] == []


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"datasets": "ms_cxr"}, ["ms_cxr/c", "ms_cxr/d"]),
        ({"splits": ["train"]}, ["chestx_det/a", "chestx_det/b"]),
        ({"view_positions": {"PA"}}, ["chestx_det/a", "ms_cxr/c"]),
        ({"view_positions": ("PA", "AP")}, ["chestx_det/a", "chestx_det/b", "ms_cxr/c"]),
        (
            {"datasets": ["chestx_det", "ms_cxr"], "splits": "test", "view_positions": "PA"},
            ["ms_cxr/c"],
        ),
    ],
)
def test_filters_keep_the_matching_rows(manifest_path, filters, expected):
    dataset = ManifestDataset(manifest_path, **filters)
    assert [sample["image_id"] for sample in dataset] == expected


def test_filtered_rows_read_their_own_pixels(manifest_path):
    dataset = ManifestDataset(manifest_path, view_positions="LATERAL")
    np.testing.assert_allclose(dataset[0]["img"][0], image_pixels(3) / 127.5 - 1, atol=1e-6)


def test_filter_matching_nothing_names_the_available_values(manifest_path):
    with pytest.raises(ValueError, match=r"mscxr.*chestx_det.*ms_cxr"):
        ManifestDataset(manifest_path, datasets="mscxr")


def test_frame_with_nullable_labels_works_given_an_output_root(manifest_path, output_root):
    frame = pd.read_parquet(manifest_path)
    frame[list(LABEL_COLUMNS)] = frame[list(LABEL_COLUMNS)].astype("Int8")
    dataset = ManifestDataset(frame, output_root=output_root)
    assert np.isnan(dataset[3]["cls"]).all()
    assert dataset[0]["cls"][LABEL_COLUMNS.index("label_mass")] == 0
    with pytest.raises(ValueError, match="output_root"):
        ManifestDataset(frame)


def test_table_without_manifest_columns_is_rejected(output_root):
    with pytest.raises(ValueError, match="bboxes_resized"):
        ManifestDataset(pd.DataFrame({"image_id": ["x"]}), output_root=output_root)


def test_indexing_supports_negatives_and_stops_at_the_end(dataset):
    assert dataset[-1]["image_id"] == IDS[-1]
    with pytest.raises(IndexError):
        dataset[len(ROWS)]


def test_pickled_dataset_reopens_its_memory_maps(dataset):
    dataset[0]
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._packed == {}
    np.testing.assert_array_equal(clone[0]["img"], dataset[0]["img"])


def test_tensor_fields_go_through_torch_from_numpy_when_torch_exists(dataset, monkeypatch):
    fake_torch = SimpleNamespace(from_numpy=lambda array: ("tensor", array))
    monkeypatch.setattr(loader, "torch", fake_torch)
    sample = dataset[0]
    for field in ("img", "mask", "cls", "bboxes"):
        assert sample[field][0] == "tensor", field
    assert sample["bbox_labels"] == ["nodule", "pleural_effusion"]
    assert sample["image_id"] == "chestx_det/a"
