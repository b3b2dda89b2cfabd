"""Digital X-Ray (For Presentation) DICOM files in the pixel encodings MIMIC-CXR users meet."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import UID, ExplicitVRLittleEndian, JPEG2000Lossless, RLELossless

from radharmony_pipeline.synthetic.radiograph import to_unsigned

DX_FOR_PRESENTATION = UID("1.2.840.10008.5.1.4.1.1.1.1")


@dataclass(frozen=True)
class DicomVariant:
    """How one file stores its pixels."""

    transfer_syntax: UID
    photometric: str
    bits_stored: int
    windowed: bool
    rescale: tuple[int, int] | None  # (slope, intercept), or no Rescale tags


# Together these cover every syntax, both photometric interpretations, BitsStored <= 12 and
# > 12, and files with and without window and rescale tags.
COVERING_VARIANTS: tuple[DicomVariant, ...] = (
    DicomVariant(ExplicitVRLittleEndian, "MONOCHROME2", 12, True, None),
    DicomVariant(RLELossless, "MONOCHROME1", 15, False, (1, 0)),
    DicomVariant(JPEG2000Lossless, "MONOCHROME1", 12, True, (2, -1024)),
    DicomVariant(JPEG2000Lossless, "MONOCHROME2", 15, False, None),
    DicomVariant(RLELossless, "MONOCHROME2", 12, True, (1, 0)),
    DicomVariant(ExplicitVRLittleEndian, "MONOCHROME1", 15, False, (1, 0)),
)


@dataclass(frozen=True)
class DicomIdentity:
    """Who and what the file describes."""

    patient_id: str
    study_uid: str
    series_uid: str
    sop_uid: str
    view_position: str


def dicom_bytes(pixels: np.ndarray, variant: DicomVariant, identity: DicomIdentity) -> bytes:
    """Encode [0, 1] pixels (bright = dense) as a DX For Presentation DICOM file."""
    stored = to_unsigned(pixels, variant.bits_stored)
    if variant.photometric == "MONOCHROME1":
        # MONOCHROME1 displays low values bright: store the complement so it looks the same.
        stored = np.uint16((1 << variant.bits_stored) - 1) - stored
    ds = _header(identity)
    _describe_pixels(ds, stored, variant)
    ds.PixelData = stored.astype("<u2").tobytes()
    if variant.transfer_syntax != ExplicitVRLittleEndian:
        # pydicom would otherwise mint a fresh, time-based SOP Instance UID.
        ds.compress(variant.transfer_syntax, generate_instance_uid=False)
    buffer = io.BytesIO()
    ds.save_as(buffer, enforce_file_format=True)
    return buffer.getvalue()


def _header(identity: DicomIdentity) -> Dataset:
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DX_FOR_PRESENTATION
    meta.MediaStorageSOPInstanceUID = UID(identity.sop_uid)
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SpecificCharacterSet = "ISO_IR 100"
    ds.ImageType = ["ORIGINAL", "PRIMARY"]
    ds.SOPClassUID = DX_FOR_PRESENTATION
    ds.SOPInstanceUID = identity.sop_uid
    ds.Modality = "DX"
    ds.PresentationIntentType = "FOR PRESENTATION"
    ds.PatientID = identity.patient_id
    ds.BodyPartExamined = "CHEST"
    ds.ViewPosition = identity.view_position
    ds.StudyInstanceUID = identity.study_uid
    ds.SeriesInstanceUID = identity.series_uid
    ds.SeriesNumber = 1
    ds.InstanceNumber = 1
    return ds


def _describe_pixels(ds: Dataset, stored: np.ndarray, variant: DicomVariant) -> None:
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = variant.photometric
    ds.Rows, ds.Columns = stored.shape
    ds.BitsAllocated = 16
    ds.BitsStored = variant.bits_stored
    ds.HighBit = variant.bits_stored - 1
    ds.PixelRepresentation = 0
    slope, intercept = variant.rescale or (1, 0)
    if variant.rescale is not None:
        ds.RescaleIntercept = str(intercept)
        ds.RescaleSlope = str(slope)
        ds.RescaleType = "US"
    if variant.windowed:
        low, high = int(stored.min()) * slope + intercept, int(stored.max()) * slope + intercept
        ds.WindowCenter = str((low + high) // 2)
        ds.WindowWidth = str(max(1, high - low))
