"""View positions of MIMIC-CXR images: the JPG release's metadata CSV, else DICOM headers."""

from __future__ import annotations

import pandas as pd

from ..processing.imaging.image_files import ImageFileError, confined
from ..processing.storage import source_store
from ..processing.storage.source_store import SourcePath
from .base import read_csv, require_columns

METADATA_NAMES = ("mimic-cxr-2.0.0-metadata.csv.gz", "mimic-cxr-2.0.0-metadata.csv")
VIEW_POSITION_TAG = 0x00185101  # (0018,5101) ViewPosition


def metadata_csv(mimic_root: SourcePath) -> SourcePath | None:
    """The metadata CSV at the MIMIC-CXR root (beside `files/`), when there is one."""
    return next(
        (mimic_root / n for n in METADATA_NAMES if source_store.is_file(mimic_root / n)), None
    )


def raw_view_positions(files_dir: SourcePath, dicom_ids: pd.Series, paths: pd.Series) -> pd.Series:
    """`ViewPosition` per image as the source states it (null when nothing states it).

    The metadata CSV wins when it names the image; otherwise a `.dcm` file's header tag
    (0018,5101) is read without its pixel data; a JPG the CSV does not name stays null.
    """
    views = pd.Series(pd.NA, index=dicom_ids.index, dtype="string")
    csv_path = metadata_csv(files_dir.parent)
    listed = pd.Series(False, index=dicom_ids.index)
    if csv_path is not None:
        columns = ("dicom_id", "ViewPosition")
        table = read_csv(csv_path, dtype=dict.fromkeys(columns, "string"), columns=columns)
        require_columns(table, ("dicom_id", "ViewPosition"), csv_path)
        by_id = table.drop_duplicates("dicom_id").set_index("dicom_id")["ViewPosition"]
        listed = dicom_ids.isin(by_id.index)
        views = views.mask(listed, dicom_ids.map(by_id).astype("string"))
    dicoms = paths.str.endswith(".dcm").fillna(False).to_numpy()
    for position in views.index[~listed.to_numpy() & dicoms]:
        views.loc[position] = dicom_view_position(files_dir / paths.loc[position], files_dir)
    return views


def dicom_view_position(path: SourcePath, files_dir: SourcePath) -> str | None:
    """The header's ViewPosition, read without the pixel data; None when absent, unreadable or
    outside `files_dir` through a symlink (the images stage reports those files)."""
    try:
        confined(path, files_dir)
    except ImageFileError:
        return None
    # Imported here: pydicom takes ~0.3 s to import, which loading the definitions (CLI,
    # webserver, every step) would otherwise pay for the few trees that hold DICOMs.
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        # A header read: on a store only the first blocks of the object are fetched.
        with source_store.open_source_file(path) as handle:
            header = pydicom.dcmread(
                handle, stop_before_pixels=True, specific_tags=[VIEW_POSITION_TAG]
            )
    except (OSError, InvalidDicomError):
        return None
    value = header.get(VIEW_POSITION_TAG)
    text = str(value.value).strip() if value is not None and value.value is not None else ""
    return text or None
