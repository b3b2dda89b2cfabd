"""Moving an output root from the flat layout (every per-image output of a partition in one
folder: `images/<partition>/<image_key>.png`, `masks/<partition>/<image_key>/`) into the shard
folders output_layout names: files renamed (objects copied then deleted on a store), never
decoded, and the tables that record their paths rewritten, each published whole.

A stage's outputs of one partition migrate as a unit under a journal file: written before the
first move and removed after the last table is rewritten, so a root whose journal remains is
unfinished (the loader refuses it) and the next run finishes the job. Every part is idempotent:
an output already in its shard is left alone, a path already sharded stays as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from radharmony_pipeline.processing.corpus.card import CROISSANT_NAME, IMAGE_FILES, MANIFEST_FILE
from radharmony_pipeline.processing.storage.atomic import TEMP_MARKER
from radharmony_pipeline.processing.storage.output_layout import (
    LAYOUT_MIGRATIONS,
    RESIZED_IMAGE_SUFFIX,
    SHARD_DIGITS,
    UNION_MASK_SUFFIX,
    image_shard,
    is_shard_name,
    layout_migration_journal,
    mask_folder,
    resized_image_folder,
    table_path,
)
from radharmony_pipeline.processing.storage.retry_policy import is_local, with_retries
from radharmony_pipeline.processing.storage.store import (
    OutputPath,
    exists,
    listing,
    publish_bytes,
    read_bytes,
    remove,
)

# Version of the journal's content: a journal of another version is refused, not guessed at.
JOURNAL_FORMAT = 1
# Concurrent copy-and-delete requests when the root is on an object store.
STORE_MOVES_IN_FLIGHT = 16
# The glob Croissant descriptions written before sharding list the resized PNGs with.
FLAT_RESIZED_PNG_GLOB = f"{resized_image_folder('*')}/*.png"


class LayoutMigrationError(RuntimeError):
    """The output root is in a state the migration does not expect; nothing was guessed."""


@dataclass(frozen=True)
class RecordedPaths:
    """A table whose columns name outputs of the stage (paths relative to the root); a
    partitioned table's file is `tables/<table>/<partition>.parquet`."""

    table: str
    columns: tuple[str, ...]
    partitioned: bool


@dataclass(frozen=True)
class StageOutputs:
    """One stage's per-image outputs in a partition: the folder they live in, how deep an
    output lies below it in the flat layout (`<key>.png`: 1; `<key>/<class>.png`: 2), the image
    key a flat entry (the first name below the folder) belongs to, and the tables that record
    their paths."""

    stage: str
    folder: Callable[[str], str]
    flat_depth: int
    key_of_entry: Callable[[str], str]
    tables: tuple[RecordedPaths, ...]


def _key_of_resized_png(name: str) -> str:
    for suffix in (UNION_MASK_SUFFIX, RESIZED_IMAGE_SUFFIX):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    raise LayoutMigrationError(f"{name}: not a resized PNG (`<image_key>.png` or `.mask.png`)")


STAGES = {
    "masks": StageOutputs(
        "masks",
        mask_folder,
        2,
        lambda entry: entry,
        (RecordedPaths("masks", ("mask_path",), partitioned=True),),
    ),
    "images": StageOutputs(
        "images",
        resized_image_folder,
        1,
        _key_of_resized_png,
        (
            RecordedPaths("images", ("image_path", "mask_path"), partitioned=True),
            RecordedPaths("unified_manifest", ("image_path", "mask_path"), partitioned=False),
            RecordedPaths("near_duplicates", ("image_path",), partitioned=False),
        ),
    ),
}


@dataclass(frozen=True)
class RewrittenTable:
    """A table file the migration rewrote, and the SHA-256 of its new content."""

    table: str
    partition: str | None
    sha256: str


@dataclass
class MigrationResult:
    stage: str
    partition: str
    moved: int = 0
    resumed: bool = False
    rewritten: list[RewrittenTable] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.resumed or self.moved > 0 or bool(self.rewritten)

    def describe(self) -> str:
        tables = ", ".join(t.table for t in self.rewritten) or "none"
        finished = "finished an interrupted migration: " if self.resumed else ""
        return (
            f"{self.stage} outputs of {self.partition}: {finished}{self.moved:,} flat entries "
            f"moved into shard folders (nothing decoded); tables rewritten: {tables}"
        )


def migrate_stage_outputs(root: OutputPath, stage: str, partition: str) -> MigrationResult:
    """Move `stage`'s flat outputs of `partition` into their shard folders and rewrite the
    paths the tables record; finish an interrupted migration. Nothing is read beyond one
    listing of the stage's folder when it is already sharded."""
    outputs = STAGES[stage]
    journal = root / layout_migration_journal(stage, partition)
    result = MigrationResult(stage, partition, resumed=_read_journal(journal, stage, partition))
    folder = root / outputs.folder(partition)
    flat = _flat_entries(folder, outputs)
    if not flat and not result.resumed:
        return result
    if not result.resumed:
        content = {"format": JOURNAL_FORMAT, "stage": stage, "partition": partition}
        content["shard_digits"] = SHARD_DIGITS
        publish_bytes(journal, json.dumps(content).encode())
    result.moved = _move_into_shards(folder, flat, outputs, resuming=result.resumed)
    for recorded in outputs.tables:
        # Runs of other partitions may rewrite a corpus-wide table at the same time.
        serialized = contextlib.nullcontext() if recorded.partitioned else _corpus_lock(root)
        with serialized:
            rewritten = _rewrite_table(root, recorded, outputs, partition)
            if rewritten is not None and recorded.table == "unified_manifest":
                _follow_manifest_in_croissant(root, rewritten.sha256)
        if rewritten is not None:
            result.rewritten.append(rewritten)
    remove(journal)
    return result


def unfinished_migrations(root: OutputPath) -> list[str]:
    """`<stage>/<partition>` of every migration whose journal remains (interrupted)."""
    return sorted(
        name.removesuffix(".json")
        for name in listing(root / LAYOUT_MIGRATIONS)
        if name.endswith(".json") and TEMP_MARKER not in name
    )


def refuse_unfinished_migration(root: OutputPath) -> None:
    """Raise when a migration of the root was interrupted: its tables may name files that
    have moved since, so nothing read from it could be trusted as complete."""
    unfinished = unfinished_migrations(root)
    if unfinished:
        raise LayoutMigrationError(
            f"{root}: moving outputs into shard folders was interrupted ({', '.join(unfinished)})"
            f", so its tables may name files that have moved. Run `radharmony migrate-layout "
            f"--output-root {root}` (or materialize those partitions again) to finish it"
        )


def sharded_path(relative: str, outputs: StageOutputs, partition: str) -> str:
    """The path an output of the stage has in the sharded layout, from its flat or sharded
    path (unchanged when already sharded); an unknown form raises LayoutMigrationError."""
    prefix = outputs.folder(partition) + "/"
    parts = relative.removeprefix(prefix).split("/")
    if not relative.startswith(prefix) or "" in parts:
        raise LayoutMigrationError(f"{relative}: not below {prefix}")
    if len(parts) == outputs.flat_depth and not is_shard_name(parts[0]):
        return f"{prefix}{image_shard(outputs.key_of_entry(parts[0]))}/{'/'.join(parts)}"
    if len(parts) == outputs.flat_depth + 1 and parts[0] == image_shard(
        outputs.key_of_entry(parts[1])
    ):
        return relative
    raise LayoutMigrationError(
        f"{relative}: neither the flat layout ({outputs.flat_depth} name(s) below {prefix}) "
        f"nor that of its image's shard folder ({prefix}<shard>/…)"
    )


def _read_journal(journal: OutputPath, stage: str, partition: str) -> bool:
    """Whether an interrupted migration of the stage's partition is to be finished."""
    try:
        content = json.loads(read_bytes(journal))
    except FileNotFoundError:
        return False
    except ValueError as error:
        raise LayoutMigrationError(
            f"{journal}: unreadable migration journal ({error}); it marks an unfinished "
            f"migration of {stage} outputs of {partition}. Restore it, or remove it once every "
            f"file below {resized_image_folder(partition)} and {mask_folder(partition)} is "
            "in its shard folder"
        ) from error
    expected = {
        "format": JOURNAL_FORMAT,
        "stage": stage,
        "partition": partition,
        "shard_digits": SHARD_DIGITS,
    }
    if content != expected:
        raise LayoutMigrationError(
            f"{journal}: a migration journal of another kind ({content}, expected {expected}): "
            "finish it with the version of radharmony that started it"
        )
    return True


def _flat_entries(folder: OutputPath, outputs: StageOutputs) -> dict[str, list[str]]:
    """The stage's flat entries below `folder` (`<key>.png` files, or `<key>/` folders), each
    with the paths of its files relative to the folder. One listing of the folder itself
    (locally an entry moves whole); on a store, flat folders' objects are then listed too.
    Shard folders, temporaries and anything else (a file browser's `.DS_Store`, say) are left
    where they are."""
    moves_files = outputs.flat_depth == 1
    names = [
        name
        for name, is_folder in _children(folder)
        if is_folder != moves_files and _is_flat(name, moves_files)
    ]
    if is_local(folder) or moves_files:
        return {name: [name] for name in names}
    # A store has no folders: a flat mask folder is a prefix whose objects move one by one.
    wanted = set(names)
    entries: dict[str, list[str]] = {}
    for relative in listing(folder) if wanted else ():
        parts = relative.split("/")
        hidden = parts[-1].startswith(".")
        if len(parts) == outputs.flat_depth and parts[0] in wanted and not hidden:
            entries.setdefault(parts[0], []).append(relative)
    return entries


def _children(folder: OutputPath) -> list[tuple[str, bool]]:
    """(name, is a folder) of what lies directly in `folder`: on a store one listing with a
    delimiter (the shards are 256 prefixes), not the partition's every object."""
    if is_local(folder):
        try:
            with os.scandir(folder) as found:
                return [(entry.name, entry.is_dir()) for entry in found]
        except FileNotFoundError:
            return []
    base = folder.path.rstrip("/")
    try:
        found = with_retries(
            folder, "list the folder", lambda: folder.fs.ls(base, detail=True, refresh=True)
        )
    except FileNotFoundError:
        return []
    return [
        (info["name"].rstrip("/").rsplit("/", 1)[-1], info.get("type") == "directory")
        for info in found
    ]


def _is_flat(name: str, moves_files: bool) -> bool:
    """Whether a name below a partition's folder is an entry of the flat layout: not a shard
    folder, not hidden (temporaries begin with a dot too), a PNG when entries are files."""
    return (
        not is_shard_name(name)
        and not name.startswith(".")
        and (name.endswith(RESIZED_IMAGE_SUFFIX) or not moves_files)
    )


def _move_into_shards(
    folder: OutputPath, flat: Mapping[str, list[str]], outputs: StageOutputs, resuming: bool
) -> int:
    """Move every flat entry to `<shard>/<entry>`; the number of entries moved."""
    if is_local(folder):
        _rename_into_shards(os.fspath(folder), sorted(flat), outputs)
        return len(flat)
    moves = [
        (folder / relative, folder / image_shard(outputs.key_of_entry(entry)) / relative)
        for entry, relatives in sorted(flat.items())
        for relative in relatives
    ]
    with ThreadPoolExecutor(STORE_MOVES_IN_FLIGHT) as pool:
        list(pool.map(lambda move: _move_object(*move, resuming=resuming), moves))
    return len(flat)


def _rename_into_shards(folder: str, entries: Sequence[str], outputs: StageOutputs) -> None:
    """One rename per entry (a mask folder moves whole). A shard's names are listed once, when
    it is first used, so that an entry already there is refused without a stat per entry."""
    present: dict[str, set[str]] = {}
    for entry in entries:
        shard = image_shard(outputs.key_of_entry(entry))
        names = present.get(shard)
        if names is None:
            os.makedirs(os.path.join(folder, shard), exist_ok=True)
            names = present[shard] = set(os.listdir(os.path.join(folder, shard)))
        if entry in names:
            raise _both_exist(Path(folder, entry), Path(folder, shard, entry))
        os.rename(os.path.join(folder, entry), os.path.join(folder, shard, entry))


def _move_object(source: OutputPath, target: OutputPath, resuming: bool) -> None:
    """Copy then delete (a store has no rename). A copy is whole or absent, so when resuming
    a target that exists beside its source is the finished copy of an interrupted move."""
    if exists(target):
        if not resuming:
            raise _both_exist(source, target)
    else:
        with_retries(source, "copy the object", lambda: source.fs.cp_file(source.path, target.path))
    remove(source)


@contextlib.contextmanager
def _corpus_lock(root: OutputPath) -> Iterator[None]:
    """Serializes the read-rewrite-publish of corpus-wide tables among the processes of this
    machine (the runs of several partitions migrating at once), for a local root and a store
    alike. Processes on other machines are not covered: migrate a shared store's root with
    `radharmony migrate-layout` from one place."""
    where = os.path.abspath(root) if is_local(root) else str(root)
    name = hashlib.sha256(where.encode()).hexdigest()[:16]
    lock = Path(tempfile.gettempdir()) / f"radharmony-layout-migration-{name}.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _both_exist(source: OutputPath, target: OutputPath) -> LayoutMigrationError:
    return LayoutMigrationError(
        f"both {source} and {target} exist: the flat layout and the shard folders hold the same "
        "output. Remove the one that is not current (the other was written by another run), "
        "then run again"
    )


def _rewrite_table(
    root: OutputPath, recorded: RecordedPaths, outputs: StageOutputs, partition: str
) -> RewrittenTable | None:
    """Rewrite the table's recorded paths of the partition into the sharded layout, published
    whole; None when the table is absent or already sharded."""
    owner = partition if recorded.partitioned else None
    path = root / table_path(recorded.table, owner)
    try:
        table = pq.read_table(io.BytesIO(read_bytes(path)))
    except FileNotFoundError:
        return None
    prefix = outputs.folder(partition) + "/"
    changed = False
    for column in recorded.columns:
        if column not in table.column_names:
            continue
        values = table.column(column).to_pylist()
        rewritten = []
        for row, value in enumerate(values):
            # A corpus-wide table holds other partitions' paths too: those are left as they are.
            mine = isinstance(value, str) and (recorded.partitioned or value.startswith(prefix))
            try:
                rewritten.append(sharded_path(value, outputs, partition) if mine else value)
            except LayoutMigrationError as error:
                raise LayoutMigrationError(
                    f"{path}, row {row}, column {column}: {error}. Rebuild the partition's "
                    f"{recorded.table} (materialize it again) instead of migrating it"
                ) from error
        if rewritten != values:
            index = table.column_names.index(column)
            array = pa.array(rewritten, type=table.schema.field(column).type)
            table = table.set_column(index, table.schema.field(column), array)
            changed = True
    if not changed:
        return None
    sink = pa.BufferOutputStream()
    # As the Parquet IO manager writes tables: page checksums for `radharmony verify`.
    pq.write_table(table, sink, write_page_checksum=True)
    content = sink.getvalue().to_pybytes()
    publish_bytes(path, content)
    return RewrittenTable(recorded.table, owner, hashlib.sha256(content).hexdigest())


def _follow_manifest_in_croissant(root: OutputPath, manifest_sha256: str) -> None:
    """croissant.json names the manifest by its digest and the resized PNGs by a glob of the
    layout: both follow the rewritten manifest (the card's figures are unchanged)."""
    path = root / CROISSANT_NAME
    try:
        document = json.loads(read_bytes(path))
    except FileNotFoundError:
        return
    for entry in _entries(document.get("distribution", [])):
        if entry.get("contentUrl") == MANIFEST_FILE:
            entry["sha256"] = manifest_sha256
        includes = entry.get("includes")
        if includes == FLAT_RESIZED_PNG_GLOB:
            entry["includes"] = IMAGE_FILES
        elif isinstance(includes, list):
            entry["includes"] = [IMAGE_FILES if i == FLAT_RESIZED_PNG_GLOB else i for i in includes]
    text = json.dumps(document, indent=1, sort_keys=True, default=str) + "\n"
    publish_bytes(path, text.encode())


def _entries(distribution: object) -> Iterable[dict]:
    items = distribution if isinstance(distribution, list) else [distribution]
    return [item for item in items if isinstance(item, dict)]
