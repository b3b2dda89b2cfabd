"""Benchmark: the `report_labels` step around the labeler, on full-scale ReXGradient metadata.

The full-scale synthetic metadata (`radharmony synth --rexgradient-metadata-only --full-scale`,
written once under --keep) gives the split's real image and study counts; its labels table
is read as the pipeline reads it. Then, each timed in wall seconds:

* **first build**: every distinct report read, the rows assembled, conformed to the declared
  schema and written as Parquet. With `--labeler stand-in` (the default) the texts are read by
  a reader that returns at once, so the figure is the step's own cost on top of the labeler
  (whose speed `bench_report_labels.py` measures); `--labeler real` reads them with the report
  labeler;
* **unchanged rerun**: the previous table read back, every text's key found in it, nothing
  read, the same rows conformed and written: the target is seconds.

    .venv/bin/python benchmarks/bench_report_table.py [--split train] [--keep DIR]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from radharmony_pipeline.processing.reports.report_table import LabelledReports, label_reports
from radharmony_pipeline.processing.tables.table_schemas import REPORT_LABELS, conform
from radharmony_pipeline.sources import SourceLocation, open_source
from radharmony_pipeline.synthetic import write_full_scale_rexgradient_metadata


@dataclass(frozen=True)
class _Reading:
    labels: dict
    evidence: tuple
    mentioned: bool


class StandInReader:
    """Returns one fixed reading per text at once: the step's cost without the labeler's."""

    def read_many(self, texts: Sequence[str]) -> list[_Reading]:
        reading = _Reading({"no_finding": 1}, (), False)
        return [reading] * len(texts)


def written(result: LabelledReports, split: str) -> bytes:
    table = conform(result.table, REPORT_LABELS, {"dataset": "rexgradient", "split": split})
    sink = io.BytesIO()
    pq.write_table(table, sink, write_page_checksum=True)
    return sink.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="train", choices=("train", "val", "test"))
    parser.add_argument("--keep", type=Path, help="folder for the metadata (reused if there)")
    parser.add_argument("--labeler", choices=("stand-in", "real"), default="stand-in")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-report-table-"))
    root = folder / "rexgradient"
    if not root.exists():
        print(f"writing full-scale ReXGradient metadata under {folder} ...", flush=True)
        root = write_full_scale_rexgradient_metadata(folder)
    # Metadata only: the reader wants the image folder to exist, not to hold the images.
    (root / "deid_png").mkdir(exist_ok=True)
    source = open_source("rexgradient", SourceLocation(root=root))
    labels = source.read_split(args.split).labels
    if args.labeler == "real":
        from radharmony_pipeline.processing.reports.labeler import ReportLabeler

        reader = ReportLabeler()
    else:
        reader = StandInReader()

    start = time.perf_counter()
    first = label_reports(labels["image_id"], labels["report"], reader, "bench")
    content = written(first, args.split)
    first_s = time.perf_counter() - start

    start = time.perf_counter()
    previous = pq.read_table(io.BytesIO(content))
    again = label_reports(labels["image_id"], labels["report"], reader, "bench", previous)
    written(again, args.split)
    rerun_s = time.perf_counter() - start

    assert again.labelled == 0 and again.reused == first.distinct_reports
    print(
        f"rexgradient {args.split}: {len(first.table):,} images with a report, "
        f"{first.distinct_reports:,} distinct reports ({args.labeler} reader)"
    )
    print(f"first build     {first_s:7.1f} s  ({first.labelled:,} texts read)")
    print(
        f"unchanged rerun {rerun_s:7.1f} s  ({again.labelled} texts read, {again.reused:,} reused)"
    )


if __name__ == "__main__":
    main()
