"""`radharmony verify` finds outputs damaged after they were written (a flipped byte in a
PNG or a Parquet file, a packed array truncated or flipped with its mtime kept), and the next
materialize of the partition repairs exactly those, back to the bytes of the clean run; the
command checks them on the stages' pool and reports its progress."""

from __future__ import annotations

import os
import re
from pathlib import Path

import dagster as dg
import pytest
from fault_support import _ASSETS, STAGES, output_files

from radharmony_pipeline import cli
from radharmony_pipeline.defs.resources import pipeline_resources
from radharmony_pipeline.operations.verify import verify_outputs
from radharmony_pipeline.processing.storage import output_layout as layout
from radharmony_pipeline.synthetic import generate_datasets

pytestmark = pytest.mark.build

PARTITION = "chestx_det.test"


def damage(path: Path, how: str) -> None:
    """Flip one byte in the middle, or cut the last 100 bytes; the mtime is kept."""
    stat = path.stat()
    content = bytearray(path.read_bytes())
    if how == "flip":
        content[len(content) // 2] ^= 0x5A
    else:
        del content[-100:]
    path.write_bytes(bytes(content))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.fixture
def built(tmp_path):
    data = tmp_path / "data"
    generate_datasets(data, scale="tiny", seed=7, mimic_format="mixed")
    output = tmp_path / "output"
    with dg.instance_for_test() as instance:

        def materialize() -> dg.ExecuteInProcessResult:
            return dg.materialize(
                _ASSETS,
                partition_key=PARTITION,
                resources=pipeline_resources(data, output),
                selection=STAGES.without_checks(),
                instance=instance,
            )

        assert materialize().success
        yield output, instance, materialize


@pytest.mark.timeout(600)
@pytest.mark.parametrize("array_damage", ["truncate", "flip"])
def test_verify_finds_damaged_outputs_and_a_materialize_repairs_exactly_them(
    built, array_damage, capsys, monkeypatch
):
    output, instance, materialize = built
    assert verify_outputs(output, [PARTITION], instance) == []
    clean = output_files(output)
    resized = sorted(output.glob(layout.resized_png_glob(PARTITION)))
    pngs = [p for p in resized if not p.name.endswith(".mask.png")]
    masks = sorted(output.glob(layout.mask_png_glob(PARTITION)))
    assert pngs and masks
    damaged = {
        pngs[0]: "flip",
        masks[0]: "flip",
        output / layout.packed_images(PARTITION): array_damage,
        layout.table_file(output, "labels", PARTITION): "flip",
    }
    for path, how in damaged.items():
        damage(path, how)
    untouched_mtimes = {p: p.stat().st_mtime_ns for p in pngs[1:]}

    found = verify_outputs(output, [PARTITION], instance)
    assert {Path(m.path) for m in found} == set(damaged), [str(m) for m in found]
    assert all(m.problem for m in found)
    # The command, on a pool of two as the stages run: every mismatch printed with its path,
    # progress on stderr, exit 1.
    monkeypatch.setenv("DAGSTER_HOME", str(instance.root_directory))
    monkeypatch.setenv("RADHARMONY_WORKERS", "2")
    code = cli.main(["verify", "--partition", PARTITION, "--output-root", str(output)])
    monkeypatch.delenv("DAGSTER_HOME")
    printed = capsys.readouterr()
    assert code == 1
    assert all(str(path) in printed.out for path in damaged)
    assert "materialize those partitions again" in printed.err
    assert re.search(r"radharmony verify: (\d+)/\1 outputs checked in ", printed.err)

    repaired = materialize()
    assert repaired.success
    (images,) = repaired.asset_materializations_for_node("images")
    assert images.metadata["decoded"].value == 1  # only the damaged PNG is decoded again
    assert output_files(output) == clean
    assert {p: p.stat().st_mtime_ns for p in pngs[1:]} == untouched_mtimes
    assert verify_outputs(output, [PARTITION], instance) == []
