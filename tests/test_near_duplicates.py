"""Near duplicates on tiny synthetic data with planted copies: grouping quality, the manifest's
`duplicate_group`, the loader's options and the blocking train/test check."""

from __future__ import annotations

import itertools

import cv2
import dagster as dg
import imagehash
import numpy as np
import pandas as pd
import pytest
from corpus import materialize_stages_then_joins
from PIL import Image

from radharmony_pipeline.loader import ManifestDataset
from radharmony_pipeline.processing.corpus.duplicates import (
    near_duplicate_members,
    one_per_duplicate_group,
    train_test_leaks,
    without_cross_split_groups,
)
from radharmony_pipeline.processing.imaging.decode import decode_grayscale
from radharmony_pipeline.processing.imaging.geometry import letterbox_geometry, resize_image
from radharmony_pipeline.processing.imaging.perceptual_hash import (
    brute_force_pairs,
    close_pairs,
    hashes_to_words,
    perceptual_hash,
)
from radharmony_pipeline.processing.jobs.image_jobs import content_fingerprints
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.sources import SourceLocation, open_source, partition_keys
from radharmony_pipeline.synthetic import generate_datasets
from radharmony_pipeline.synthetic.duplicates import DEMO_DUPLICATES, LEAK, read_truth
from radharmony_pipeline.synthetic.look_alikes import (
    COPY_KINDS,
    look_alike_radiograph,
    resized_like_images_stage,
)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Tiny datasets with the demo's plants and one identical train/test leak, all stages run."""
    return _built(tmp_path_factory, (*DEMO_DUPLICATES, LEAK))


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory):
    """Tiny datasets with the demo's plants only (no identical leak): the manifest is built."""
    return _built(tmp_path_factory, DEMO_DUPLICATES)


def _built(tmp_path_factory, plants):
    data = tmp_path_factory.mktemp("planted") / "data"
    generate_datasets(data, scale="tiny", seed=7, duplicates=plants)
    output = tmp_path_factory.mktemp("planted_out")
    joined = materialize_stages_then_joins(data, output)
    members = pd.read_parquet(layout.table_file(output, "near_duplicates"))
    return data, output, members, joined


def _component_pairs(labels: dict[str, object]) -> set[frozenset]:
    by_label: dict[object, list[str]] = {}
    for image_id, label in labels.items():
        by_label.setdefault(label, []).append(image_id)
    return {
        frozenset(pair)
        for ids in by_label.values()
        for pair in itertools.combinations(sorted(ids), 2)
    }


@pytest.mark.build
def test_planted_pairs_found_with_high_recall_and_precision(planted):
    data, _, members, _ = planted
    truth = read_truth(data)
    planted_pairs = {frozenset((t["source_id"], t["target_id"])) for t in truth}
    found = _component_pairs(dict(zip(members["image_id"], members["group_id"], strict=True)))
    recall = len(planted_pairs & found) / len(planted_pairs)
    # Every reported pair must be a planted one: distinct radiographs are never grouped.
    precision = len(found & planted_pairs) / max(len(found), 1)
    assert recall >= 0.95, sorted(map(sorted, planted_pairs - found))
    assert precision >= 0.95, sorted(map(sorted, found - planted_pairs))
    assert len(found) == len(planted_pairs)


@pytest.mark.build
def test_kinds_and_spans(planted):
    data, _, members, _ = planted
    kind = dict(zip(members["image_id"], members["kind"], strict=True))
    for plant in read_truth(data):
        expected = {"copy": "identical_file", "as_png": "identical_pixels"}.get(plant["transform"])
        if expected:
            assert kind[plant["source_id"]] == kind[plant["target_id"]] == expected
        elif plant["transform"] == "shifted":
            assert kind[plant["target_id"]] == "near"
    leak = members[members["image_id"].isin([t["target_id"] for t in read_truth(data)][-1:])]
    assert list(leak.iloc[0]["group_splits"]) == ["chestx_det.test", "chestx_det.train"]
    assert (
        members.groupby("group_id")["image_id"].transform("size") == members["group_size"]
    ).all()
    representative = members["image_id"] == members["representative_id"]
    assert (members.loc[representative, "distance_to_representative"] == 0).all()


@pytest.mark.build
def test_identical_train_test_pair_blocks_and_names_both(planted):
    data, _, _, joined = planted
    leak = read_truth(data)[-1]
    evaluation = next(
        e
        for e in joined.get_asset_check_evaluations()
        if e.check_name == "no_identical_images_across_train_and_test"
    )
    assert not evaluation.passed
    assert leak["source_id"] in evaluation.description
    assert leak["target_id"] in evaluation.description
    warning = next(
        e
        for e in joined.get_asset_check_evaluations()
        if e.check_name == "near_duplicates_across_splits"
    )
    assert warning.severity == dg.AssetCheckSeverity.WARN
    # The shifted copy and the identical leak: two ChestX-Det test images with a train twin.
    count = warning.metadata["chestx_det_test_images_with_near_duplicate_in_train"].value
    assert count == 2


def test_near_pair_across_splits_is_not_identical():
    rows = [
        ("chestx_det/1", "chestx_det", "train", "a", "p1"),
        ("chestx_det/2", "chestx_det", "test", "b", "p2"),
    ]
    frame = pd.DataFrame(
        rows, columns=["image_id", "dataset", "split", "source_sha256", "pixels_sha256"]
    )
    frame["image_path"] = "x.png"
    frame["perceptual_hash"] = ["0" * 64, "0" * 63 + "3"]
    film = look_alike_radiograph(3, 0, 190)
    contents = {
        "chestx_det/1": resized_like_images_stage(film, 224)[1],
        "chestx_det/2": resized_like_images_stage(COPY_KINDS["jpeg_quality"](film), 224)[1],
    }
    members = near_duplicate_members(
        frame, lambda rows: [contents[i] for i in rows["image_id"]]
    ).members
    assert list(members["kind"]) == ["near", "near"]
    assert [leak.identical for leak in train_test_leaks(members)] == [False]


@pytest.mark.build
def test_blocked_leak_stops_the_manifest(planted):
    _, output, _, joined = planted
    assert not joined.success
    assert not (output / layout.MANIFEST).exists()


@pytest.mark.build
def test_manifest_duplicate_group_and_loader_options(demo_like):
    data, output, members, joined = demo_like
    assert joined.success
    path = output / layout.MANIFEST
    manifest = pd.read_parquet(path)
    groups = dict(zip(members["image_id"], members["group_id"], strict=True))
    assert manifest["duplicate_group"].notna().sum() == len(members)
    for row in manifest.dropna(subset=["duplicate_group"]).itertuples():
        assert groups[row.image_id] == row.duplicate_group
    truth = {t["transform"]: t for t in read_truth(data)}
    shifted = {truth["shifted"]["source_id"], truth["shifted"]["target_id"]}  # train ~ test
    copies = {truth["copy"]["source_id"], truth["copy"]["target_id"]}  # both in train

    everything = ManifestDataset(path, datasets="chestx_det")
    ids = set(everything.table["image_id"])
    assert shifted | copies <= ids

    clean = ManifestDataset(path, datasets="chestx_det", drop_cross_split_duplicates=True)
    kept = set(clean.table["image_id"])
    assert not shifted & kept  # both sides of the train/test group are gone
    assert copies <= kept  # a group inside one split stays
    assert len(kept) == len(ids) - 2

    single = ManifestDataset(path, datasets="chestx_det", one_per_duplicate_group=True)
    kept = set(single.table["image_id"])
    assert len(kept & copies) == 1 and len(kept & shifted) == 1
    assert min(copies) in kept
    own = members[members["dataset"] == "chestx_det"]
    assert len(single) == len(everything) - len(own) + own["group_id"].nunique()
    assert single[0]["img"].shape[-1] == everything[0]["img"].shape[-1]


def test_loader_options_on_a_frame():
    manifest = pd.DataFrame(
        {
            "image_id": ["a", "b", "c", "d", "e"],
            "split": ["train", "test", "train", "train", "val"],
            "duplicate_group": pd.array(["g1", "g1", "g2", "g2", None], dtype="string"),
        }
    )
    assert list(without_cross_split_groups(manifest)["image_id"]) == ["c", "d", "e"]
    assert list(one_per_duplicate_group(manifest)["image_id"]) == ["a", "c", "e"]


def test_distinct_radiographs_are_not_grouped(tiny_root):
    hashes = []
    for dataset, split in (
        ("chestx_det", "train"),
        ("chexlocalize", "test"),
        ("rexgradient", "train"),
    ):
        source = open_source(dataset, SourceLocation(), {"RADHARMONY_DATA_ROOT": str(tiny_root)})
        for relative in source.read_split(split).index["image_path"]:
            decoded = decode_grayscale(source.image_dir(split) / relative, target_size=224)
            geometry = letterbox_geometry(decoded.source_height, decoded.source_width, 224)
            pixels = resize_image(decoded.pixels, geometry)
            hashes.append(content_fingerprints(pixels, geometry)["perceptual_hash"])
    words = np.unique(hashes_to_words(hashes), axis=0)
    assert len(words) > 20
    assert len(close_pairs(words)) == len(brute_force_pairs(words)) == 0


@pytest.mark.parametrize("shape", [(224, 224), (224, 181), (97, 224), (17, 16), (5, 300)])
def test_the_hash_is_imagehash_dhash_of_the_same_pixels(shape):
    # Outputs written before keep their hashes in their headers: new ones must be equal.
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    smooth = cv2.GaussianBlur(rng.integers(0, 256, shape, dtype=np.uint8), (0, 0), 3)
    framed = np.pad(rng.integers(0, 256, shape, dtype=np.uint8), 4)
    content = framed[4:-4, 4:-4]  # a view inside a frame, as the padding is cut off
    for pixels in (smooth, content, np.full(shape, 7, np.uint8)):
        expected = str(imagehash.dhash(Image.fromarray(pixels), hash_size=16))
        assert perceptual_hash(pixels) == expected


@pytest.mark.build
def test_profiles_are_pictures_of_every_partition_and_the_corpus(demo_like):
    _, output, _, joined = demo_like
    for name in [*partition_keys(), "corpus"]:
        with Image.open(output / layout.preview("profile", name)) as image:
            assert image.format == "PNG" and image.width > 1000 and image.height > 500
    corpus = next(
        e.materialization
        for e in joined.get_asset_materialization_events()
        if e.materialization.asset_key == dg.AssetKey("corpus_profile")
    )
    assert corpus.metadata["profile_inline"].value.startswith("![profile of corpus](data:image/png")
    prevalence = pd.read_parquet(layout.table_file(output, "corpus_profile"))
    manifest = pd.read_parquet(output / layout.MANIFEST)
    chestx = prevalence[(prevalence["dataset"] == "chestx_det") & (prevalence["label"] == "nodule")]
    rows = manifest[manifest["dataset"] == "chestx_det"]
    assert int(chestx["positive"].iloc[0]) == int((rows["label_nodule"] == 1).sum())
    assert int(chestx["not_annotated"].iloc[0]) == 0
    rex = prevalence[prevalence["dataset"] == "rexgradient"]
    assert (rex["positive"] == 0).all() and (rex["not_annotated"] > 0).all()


@pytest.mark.build
def test_near_duplicate_sheet_shows_groups(demo_like):
    _, output, members, _ = demo_like
    with Image.open(output / layout.NEAR_DUPLICATE_SHEET) as sheet:
        assert sheet.width == 4 * 224
        assert sheet.height > members["group_id"].nunique() * 224


def test_a_large_identical_group_across_splits_is_one_line_per_test_image():
    n = 2_000
    frame = pd.DataFrame(
        {
            "image_id": [f"rexgradient/{i:05d}" for i in range(n)],
            "dataset": "rexgradient",
            "split": ["train" if i % 2 else "test" for i in range(n)],
            "image_path": "x.png",
            "perceptual_hash": "ab" * 32,
            "source_sha256": "same",
            "pixels_sha256": "same",
        }
    )
    members = near_duplicate_members(frame, _no_pixels).members
    assert len(members) == n and members["group_id"].nunique() == 1
    assert (members["kind"] == "identical_file").all()
    leaks = train_test_leaks(members)
    assert len(leaks) == n // 2 and all(leak.identical for leak in leaks)
    assert {leak.test_id for leak in leaks} == set(frame.loc[frame["split"] == "test", "image_id"])


def test_no_usable_images_gives_an_empty_typed_table():
    columns = ["image_id", "dataset", "split", "image_path", "perceptual_hash"]
    frame = pd.DataFrame({c: pd.Series(dtype="string") for c in columns})
    frame["source_sha256"] = frame["pixels_sha256"] = pd.Series(dtype="string")
    members = near_duplicate_members(frame, _no_pixels).members
    assert members.empty and members["group_size"].dtype == "int64"
    assert train_test_leaks(members) == []


def _no_pixels(rows: pd.DataFrame) -> list[np.ndarray]:
    raise AssertionError(f"identical images need no pixels; read {list(rows['image_id'])}")
