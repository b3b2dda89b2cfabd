"""NIH ChestX-ray14, the parent of ChestX-Det: `Data_Entry_2017.csv`, the official
`train_val_list.txt` / `test_list.txt`, and 112,120 PNGs under `images/` or
`images_001/images/` … `images_012/images/`."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import pandas as pd

from ..processing.storage import source_store
from ..processing.storage.source_store import FileState, SourcePath
from .base import fail_at_first_bad_row, read_csv, require_columns
from .errors import DatasetLayoutError, MetadataError

KEY = "nih_chestxray14"
ENV_VAR = "RADHARMONY_NIH_ROOT"
FOLDER = "nih-chestxray14"
DATA_ENTRY_NAMES = ("Data_Entry_2017.csv", "Data_Entry_2017_v2020.csv")
SPLIT_LISTS = {"train_val": "train_val_list.txt", "test": "test_list.txt"}
DATA_ENTRY_COLUMNS = ("Image Index", "Finding Labels", "Follow-up #", "Patient ID")
LAYOUT = """\
nih-chestxray14/
  Data_Entry_2017.csv, train_val_list.txt, test_list.txt
  images/<Image Index>.png   or   images_001/images/ … images_012/images/<Image Index>.png"""


@dataclass(frozen=True)
class NihChestXray14:
    """The NIH download at `root`."""

    root: SourcePath

    @classmethod
    def located(cls, given: SourcePath | None, data_root: SourcePath) -> NihChestXray14 | None:
        """The download at the given root (which must hold it), else under the data root
        when it is there; None when the user has no NIH download."""
        if given is not None:
            source = cls(given)
            source.data_entry()  # a given root that is not the download is an error
            return source
        default = cls(data_root / FOLDER)
        return default if default._data_entry_or_none() is not None else None

    def data_entry(self) -> SourcePath:
        found = self._data_entry_or_none()
        if found is None:
            raise DatasetLayoutError(
                KEY,
                self.root / DATA_ENTRY_NAMES[0],
                ENV_VAR,
                LAYOUT,
                "Data_Entry_2017.csv not found",
            )
        return found

    def _data_entry_or_none(self) -> SourcePath | None:
        return next(
            (self.root / n for n in DATA_ENTRY_NAMES if source_store.is_file(self.root / n)), None
        )

    def metadata_files(self) -> list[SourcePath]:
        """The files the patients and official splits come from."""
        return [self.data_entry(), *(self.root / name for name in SPLIT_LISTS.values())]

    def read_entries(self) -> pd.DataFrame:
        """One row per image: `image_index, patient_id, follow_up, view_position, split`
        (`train_val`, `test`, or null when in neither list)."""
        path = self.data_entry()
        table = read_csv(path, dtype={"Image Index": "string", "Patient ID": "string"})
        require_columns(table, DATA_ENTRY_COLUMNS, path)
        index = table["Image Index"].str.strip()
        fail_at_first_bad_row(
            index.isna() | index.duplicated(),
            path,
            lambda row: "Image Index missing or listed twice",
            "Re-download it",
        )
        split = pd.Series(pd.NA, index=table.index, dtype="string")
        for name, listed in self._split_lists().items():
            split = split.mask(index.isin(listed), name)
        return pd.DataFrame(
            {
                "image_index": index,
                "patient_id": table["Patient ID"].str.strip().str.lstrip("0").replace("", "0"),
                "follow_up": pd.to_numeric(table["Follow-up #"], errors="coerce").astype("Int64"),
                "view_position": (
                    table["View Position"].astype("string")
                    if "View Position" in table
                    else pd.Series(pd.NA, index=table.index, dtype="string")
                ),
                "split": split,
            }
        )

    def _split_lists(self) -> dict[str, set[str]]:
        lists = {}
        for name, file_name in SPLIT_LISTS.items():
            path = self.root / file_name
            if not source_store.is_file(path):
                raise DatasetLayoutError(KEY, path, ENV_VAR, LAYOUT, f"{file_name} not found")
            text = source_store.read_source_bytes(path).decode("utf-8", errors="strict")
            lists[name] = {line.strip() for line in text.splitlines() if line.strip()}
        overlap = lists["train_val"] & lists["test"]
        if overlap:
            raise MetadataError(
                self.root / SPLIT_LISTS["test"],
                f"image {sorted(overlap)[0]}",
                "is in both train_val_list.txt and test_list.txt",
                "Re-download the official split lists",
            )
        return lists

    def image_states(self) -> dict[str, FileState]:
        """Every PNG of the download by its path relative to the root (`images/…` or
        `images_NNN/images/…`); the file name is its Image Index."""
        states = source_store.tree_states(self.root, (".png",))
        return {
            name: state
            for name, state in states.items()
            if posixpath.dirname(name).split("/")[-1] == "images"
        }
