"""Check a partition's download before any run: files found, images present, a sample of
headers, counts against the documented ones, and each problem with the fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from PIL import Image

from ..processing.storage import source_store
from ..processing.storage.source_store import SourcePath
from ..vocabulary import STATUS_OK
from .base import DatasetSource, SplitTables
from .counts import compare_counts, is_dataset_metric
from .errors import DatasetLayoutError, SourceError
from .layouts import nearby

# Headers read per partition: the first, middle and last image the metadata names.
HEADER_SAMPLES = 3
MISSING_SHOWN = 3
OK, UNUSABLE, NOT_CONFIGURED = "ok", "unusable", "not configured"
# The variable that sets a dataset's image folder directly, where there is one.
_IMAGE_FOLDER_SETTING = {"base_image_dir"}


@dataclass(frozen=True)
class Problem:
    """What is wrong and what to do about it; `blocking` problems make the partition unusable."""

    what: str
    fix: str
    blocking: bool = True

    def describe(self) -> str:
        return f"{'ERROR' if self.blocking else 'warning'}: {self.what}. Fix: {self.fix}"


@dataclass(frozen=True)
class ImageHeader:
    name: str
    format: str
    width: int | None = None
    height: int | None = None
    mode: str | None = None
    bit_depth: int | None = None
    problem: str | None = None

    def kind(self) -> str:
        if self.problem:
            return f"unreadable ({self.problem})"
        return f"{self.format} {self.mode} {self.bit_depth}-bit"


def _header_summary(headers: Sequence[ImageHeader]) -> str:
    """`2x PNG L 8-bit, 1x PNG RGBA 8-bit (e.g. 50942.png 1024x1024)`."""
    kinds: dict[str, int] = {}
    for header in headers:
        kinds[header.kind()] = kinds.get(header.kind(), 0) + 1
    example = next((h for h in headers if not h.problem), None)
    shown = ", ".join(f"{count}x {kind}" for kind, count in kinds.items())
    if example is not None:
        shown += f" (e.g. {example.name} {example.width}x{example.height})"
    return shown


@dataclass(frozen=True)
class ImagePresence:
    """How many of the images the metadata names are in the image folder (one listing)."""

    named: int
    present: int
    missing_examples: tuple[str, ...]
    # A folder near the image folder that holds the first missing image, if one does.
    found_elsewhere: SourcePath | None = None

    @property
    def missing(self) -> int:
        return self.named - self.present

    @property
    def missing_share(self) -> float:
        return self.missing / self.named if self.named else 0.0


@dataclass
class PartitionReport:
    partition: str
    status: str = OK
    notes: list[str] = field(default_factory=list)
    annotation_files: list[tuple[str, int | None]] = field(default_factory=list)
    image_dir: str = ""
    presence: ImagePresence | None = None
    headers: list[ImageHeader] = field(default_factory=list)
    counts: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def add(self, problem: Problem) -> None:
        self.problems.append(problem)
        if problem.blocking:
            self.status = UNUSABLE

    def lines(self) -> list[str]:
        """The report as printed by `radharmony check-data`: a headline, then details."""
        headline = f"{self.partition:<20} {self.status}"
        if self.presence is not None:
            headline += f"  images {self.presence.present}/{self.presence.named} present"
        if self.status == NOT_CONFIGURED:
            return [headline + "  " + "; ".join(p.fix for p in self.problems)]
        details = [*self.notes]
        for path, size in self.annotation_files:
            details.append(f"annotation {path} ({_size_text(size)})")
        details.append(f"image folder {self.image_dir}")
        if self.headers:
            details.append(f"sample headers: {_header_summary(self.headers)}")
        if self.counts:
            details.append("counts found/documented: " + ", ".join(self.counts))
        details.extend(problem.describe() for problem in self.problems)
        return [headline, *(f"    {line}" for line in details)]

    def summary(self) -> str:
        """One line for the UI: the status and the first problem with its fix."""
        first = next((p for p in self.problems if p.blocking), None) or next(
            iter(self.problems), None
        )
        presence = (
            f", images {self.presence.present}/{self.presence.named} present"
            if self.presence
            else ""
        )
        return f"{self.status}{presence}" + (f"; {first.describe()}" if first else "")


def check_partition(
    source: DatasetSource, split: str, configured: bool, missing_limit: float
) -> PartitionReport:
    """Everything `radharmony check-data` says about one partition; never raises for data."""
    report = PartitionReport(partition=f"{source.key}.{split}")
    if not configured:
        variables = " or ".join(source.env_vars.values())
        report.status = NOT_CONFIGURED
        report.problems.append(
            Problem(
                f"nothing at {source.root}",
                f"to use it, set {variables} or put it under RADHARMONY_DATA_ROOT",
                blocking=False,
            )
        )
        return report
    report.notes = [f"layout: {note}" for note in source.layout_notes()]
    try:
        report.annotation_files = [
            (str(path), _file_size(path)) for path in source.annotation_files(split)
        ]
        report.image_dir = str(source.image_dir(split))
        tables = source.read_split(split)
    except SourceError as error:
        report.add(_problem_of(error, source))
        return report
    presence = image_presence(source, split, tables)
    report.presence = presence
    if presence.missing:
        problem = missing_images_problem(source, split, presence, missing_limit)
        report.add(problem)
    report.headers = sample_headers(source.image_dir(split), _present_sample(source, split, tables))
    if report.headers and all(header.problem for header in report.headers):
        report.add(
            Problem(
                f"none of the {len(report.headers)} sampled images has a readable header "
                f"({report.headers[0].problem})",
                "re-download the images; they are truncated or not images",
            )
        )
    report.counts, mismatches = _count_lines(source, split, tables)
    for mismatch in mismatches:
        report.add(mismatch)
    return report


def image_presence(source: DatasetSource, split: str, tables: SplitTables) -> ImagePresence:
    """Which of the usable rows' images exist, from one listing of the image folder."""
    base = source.image_dir(split)
    index = tables.index
    named = index.loc[index["status"] == STATUS_OK, "image_path"].dropna().tolist()
    present = source_store.existing_names(base, named)
    missing = [name for name in named if name not in present]
    return ImagePresence(
        named=len(named),
        present=len(present),
        missing_examples=tuple(missing[:MISSING_SHOWN]),
        found_elsewhere=_folder_holding(base, missing[0]) if missing else None,
    )


def missing_images_problem(
    source: DatasetSource, split: str, presence: ImagePresence, limit: float
) -> Problem:
    """The problem of missing images: blocking when their share is above `limit`."""
    base = source.image_dir(split)
    what = (
        f"{presence.missing} of {presence.named} images the metadata names are not in {base} "
        f"(e.g. {', '.join(presence.missing_examples)})"
    )
    blocking = presence.missing_share > limit
    if presence.found_elsewhere is not None:
        fix = _setting_for_image_folder(source, split, presence.found_elsewhere)
    elif blocking:
        around = nearby(base)
        variables = [
            variable
            for field_name, variable in source.env_vars.items()
            if field_name in _IMAGE_FOLDER_SETTING
        ] or list(source.env_vars.values())
        fix = f"point {' or '.join(variables)} at the download that holds them" + (
            f" ({around})" if around else ""
        )
    else:
        fix = "re-download the missing files (they become error rows otherwise)"
    return Problem(what, fix, blocking=blocking)


def sample_headers(base: SourcePath, names: Sequence[str]) -> list[ImageHeader]:
    return [read_header(base / name, name) for name in names]


def read_header(path: SourcePath, name: str) -> ImageHeader:
    """Format, size, mode and bit depth from the header alone (no pixels decoded)."""
    suffix = PurePosixPath(name).suffix.lower()
    try:
        if suffix == ".dcm":
            # Imported here: pydicom takes ~0.3 s to import, which loading the definitions
            # (every CLI command, the webserver, every step) would otherwise pay.
            import pydicom

            with source_store.open_source_file(path) as handle:
                header = pydicom.dcmread(handle, stop_before_pixels=True)
            return ImageHeader(
                name,
                "DICOM",
                int(header.Columns),
                int(header.Rows),
                str(header.PhotometricInterpretation),
                int(header.BitsStored),
            )
        with source_store.open_source_file(path) as handle, Image.open(handle) as image:
            return ImageHeader(
                name,
                str(image.format),
                image.width,
                image.height,
                image.mode,
                _bit_depth(image),
            )
    except Exception as error:  # a header parser raises many types on corrupt input
        return ImageHeader(name, suffix.lstrip(".") or "?", problem=f"{error}")


def _bit_depth(image: Image.Image) -> int:
    """Bits per sample: 16 for I;16 PNGs, 1 for bilevel, else 8 (Pillow's 8-bit modes)."""
    if image.mode.startswith("I;16") or image.mode == "I":
        return 16
    if image.mode == "1":
        return 1
    return 8


def _present_sample(source: DatasetSource, split: str, tables: SplitTables) -> list[str]:
    index = tables.index
    named = index.loc[index["status"] == STATUS_OK, "image_path"].dropna().tolist()
    if not named:
        return []
    present = source_store.existing_names(source.image_dir(split), _spread(named, 50))
    chosen = [name for name in _spread(named, 50) if name in present]
    return _spread(chosen, HEADER_SAMPLES)


def _spread(items: list[str], count: int) -> list[str]:
    """Up to `count` items spread evenly from the first to the last."""
    if len(items) <= count:
        return list(items)
    step = (len(items) - 1) / (count - 1)
    return list(dict.fromkeys(items[round(i * step)] for i in range(count)))


def _folder_holding(base: SourcePath, name: str) -> SourcePath | None:
    """A folder near `base` (a subfolder, a sibling, or one or two levels up) that holds
    `name`."""
    candidates = [
        *_subfolders(base),
        base.parent,
        *_subfolders(base.parent),
        base.parent.parent,
    ]
    for candidate in candidates:
        if candidate != base and source_store.is_file(candidate / name):
            return candidate
    return None


def _subfolders(folder: SourcePath) -> list[SourcePath]:
    if not source_store.is_dir(folder):
        return []
    return [child for child in source_store.glob(folder, "*") if source_store.is_dir(child)]


def _setting_for_image_folder(source: DatasetSource, split: str, folder: SourcePath) -> str:
    """The variable and value that make the reader use `folder` as the image folder."""
    for field_name, variable in source.env_vars.items():
        if field_name in _IMAGE_FOLDER_SETTING:
            return f"the images are in {folder}: set {variable}={folder}"
    variable = next(iter(source.env_vars.values()))
    base = source.image_dir(split)
    try:
        below_root = base.relative_to(source.root).parts
    except ValueError:
        below_root = ()
    if below_root and folder.parts[-len(below_root) :] == below_root:
        root = folder
        for _ in below_root:
            root = root.parent
        return f"the images are in {folder}: set {variable}={root}"
    return f"the images are in {folder}; move them to {base}, or set {variable}"


def _count_lines(
    source: DatasetSource, split: str, tables: SplitTables
) -> tuple[list[str], list[Problem]]:
    """`metric found/documented` for what the metadata yields, and a warning per mismatch."""
    try:
        expected = source.expected_counts()
        metrics = source.count_metrics(tables)
    except SourceError as error:
        return [], [_problem_of(error, source)]
    lines, problems = [], []
    documented = {m: v for m, v in expected.for_split(split).items() if not is_dataset_metric(m)}
    detailed_matches = 0
    for comparison in compare_counts(documented, metrics):
        if comparison.found is None:
            continue
        if "." not in comparison.metric or not comparison.matches:
            lines.append(f"{comparison.metric} {comparison.found}/{comparison.expected}")
        else:
            detailed_matches += 1
        if not comparison.matches:
            hint = source.count_hints.get(comparison.metric.split(".")[0], "")
            problems.append(
                Problem(
                    f"{comparison.metric}: {comparison.found} found, {comparison.expected} "
                    f"documented ({expected.origin})",
                    f"check {hint.format(split=split, file='the metadata')}"
                    if hint
                    else "check that the download is complete and of the documented release",
                    blocking=False,
                )
            )
    if detailed_matches:
        lines.append(f"+{detailed_matches} per-class counts that match")
    return lines, problems


def _problem_of(error: SourceError, source: DatasetSource) -> Problem:
    if isinstance(error, DatasetLayoutError):
        what = f"{error.detail}: {error.missing}"
        if error.nearby:
            what += f" ({error.nearby})"
        return Problem(what, f"set {error.env_var} to the folder that holds the download")
    text = str(error)
    what, _, fix = text.partition(". ")
    return Problem(what, fix or "use the files as downloaded")


def _file_size(path: SourcePath) -> int | None:
    if not source_store.is_file(path):
        return None
    if source_store.is_remote(path):
        return source_store.file_state(path)[0]
    return path.stat().st_size


def _size_text(size: int | None) -> str:
    if size is None:
        return "MISSING"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"
