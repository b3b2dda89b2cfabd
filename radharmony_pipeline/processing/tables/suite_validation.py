"""Validating a table against one of its suites: in this process, or in a helper process
that imports Great Expectations while the step is still reading its source.

GX takes seconds to import, and a process imports it once. A step whose source takes longer
than that to read (ReXGradient's train JSON) starts the helper as it begins, so the import
overlaps the read and the validation overlaps the step's own Parquet writes; the run's later
steps send their tables to the same helper. A run that reads no such source validates in
its own process, where GX, once imported, stays for the next validation.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from functools import cache
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import pandas as pd
import pyarrow as pa

from ..storage import output_layout as layout
from ..storage.fingerprint import arrow_fingerprint, combined_version, table_fingerprint
from ..storage.store import OutputPath, publish_bytes, read_bytes
from .suite_reports import SuiteReport, unfinished_report
from .table_schemas import SchemaMismatchError

# Before its tables are final a step reads and parses its source and looks up every image it
# names; from a source this large that takes about as long as GX's import, which the helper
# then overlaps. ReXGradient's train JSON is above it from a quarter of its count up; every
# other split's metadata is far below.
HELPER_SOURCE_BYTES = 32 << 20
# How long a wait for the helper's report goes between checks that the helper is alive.
_LIVENESS_SECONDS = 1.0
# How long a helper whose replies cannot be read gets to end before that is reported.
_EXIT_SECONDS = 10.0

# Each reply's length, before it.
_LENGTH = struct.Struct(">Q")

PendingReport = Callable[[], SuiteReport]


def validate_suite(frame: pd.DataFrame, suite: str, *arguments: Any) -> SuiteReport:
    """`frame` against the named suite (processing/tables/suites.py), in this process."""
    # Imported here: GX takes seconds, paid only by a process that validates.
    from .suites import SUITES
    from .validation import validate

    return validate(frame, suite, SUITES[suite](*arguments))


class Validator(Protocol):
    def submit(self, frame: pd.DataFrame, suite: str, *arguments: Any) -> PendingReport:
        """Start validating `frame` against `suite`; the returned call gives its report."""
        ...


class InProcessValidation:
    """Validates in this process, when the report is asked for."""

    def submit(self, frame: pd.DataFrame, suite: str, *arguments: Any) -> PendingReport:
        return lambda: validate_suite(frame, suite, *arguments)


# A table as its file holds it (given the frame and the table's name): a table computed in
# this run and the same table read back from its file then have one digest.
StoredTable = Callable[[pd.DataFrame, str], pa.Table]


class KeptReports:
    """A validator that keeps each finished report under the output root with a digest of the
    table (as its file holds it) and of the suites' code, and gives the kept report back when
    both are unchanged: an unchanged partition's re-run validates nothing (nor imports GX).
    Each suite is named by the table it validates."""

    def __init__(
        self, validator: Validator, root: OutputPath, partition: str, as_stored: StoredTable
    ) -> None:
        self.validator = validator
        self.root = root
        self.partition = partition
        self.as_stored = as_stored

    def submit(self, frame: pd.DataFrame, suite: str, *arguments: Any) -> PendingReport:
        path = self.root / layout.suite_report(self.partition, suite)
        key = combined_version(
            [suites_version(), suite, repr(arguments), self._content_digest(frame, suite)]
        )
        kept = _kept_report(path, key)
        if kept is not None:
            return lambda: kept
        pending = self.validator.submit(frame, suite, *arguments)

        def report() -> SuiteReport:
            found = pending()
            if found.finished:
                stored = json.dumps({"key": key, "report": found.to_json()}).encode()
                publish_bytes(path, stored)
            return found

        return report

    def _content_digest(self, frame: pd.DataFrame, suite: str) -> str:
        try:
            return arrow_fingerprint(self.as_stored(frame, suite))
        except SchemaMismatchError:  # the table's write reports it; until then, the frame
            return table_fingerprint(frame)


# What a report depends on besides its table: the suites, the modules their expectations take
# columns and allowed values from, and how a suite is run and reported.
_SUITE_MODULES = (
    "radharmony_pipeline.processing.tables.suites",
    "radharmony_pipeline.processing.tables.validation",
    "radharmony_pipeline.processing.tables.suite_reports",
    "radharmony_pipeline.processing.tables.table_schemas",
    "radharmony_pipeline.processing.annotations.boxes",
    "radharmony_pipeline.vocabulary",
)


@cache
def suites_version() -> str:
    """A digest of the suites' code (_SUITE_MODULES, read as files: GX is not imported) and of
    the Great Expectations release."""
    digest = hashlib.sha256(version("great_expectations").encode())
    for module in _SUITE_MODULES:
        digest.update(Path(find_spec(module).origin).read_bytes())
    return digest.hexdigest()


def _kept_report(path: OutputPath, key: str) -> SuiteReport | None:
    try:
        kept = json.loads(read_bytes(path))
        return SuiteReport.from_json(kept["report"]) if kept["key"] == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none kept, or unreadable: validated again, and kept anew


class ValidationProcess:
    """A helper process that imports GX as it starts, then validates what it is sent, in order.

    Tables go to it from a background thread, so the step goes on (writing its outputs) while
    the helper may still be importing. A helper that dies gives every report it still owes as
    failed, with its exit code: a suite that never ran never reads as passed.
    """

    def __init__(self) -> None:
        # A fresh interpreter running this module, not multiprocessing's spawn: that would
        # first re-run the main script of whatever process runs the step (a user's own
        # script calling materialize() without a __main__ guard, say). A session of its own:
        # Ctrl-C in the run's terminal reaches the run, which then stops the helper.
        to_child, self._to_helper = os.pipe()
        self._from_helper, from_child = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(to_child), str(from_child)],
                pass_fds=(to_child, from_child),
                start_new_session=True,
            )
        except BaseException:
            for descriptor in (to_child, self._to_helper, self._from_helper, from_child):
                os.close(descriptor)
            raise
        os.close(to_child)
        os.close(from_child)
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._send_error: BaseException | None = None
        # A daemon: should close() never come, the step's process still exits.
        self._sender = threading.Thread(
            target=self._send_all, name="validation-sender", daemon=True
        )
        self._sender.start()
        self._reports: dict[int, SuiteReport] = {}
        self._submitted = 0

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def exit_code(self) -> int | None:
        """The helper's exit code once it has ended (negative: the signal that ended it)."""
        return self._process.poll()

    def submit(self, frame: pd.DataFrame, suite: str, *arguments: Any) -> PendingReport:
        request = self._submitted
        self._submitted += 1
        self._outbox.put((request, frame, suite, arguments))
        return lambda: self._report(request, suite)

    def close(self) -> None:
        """Stop the helper: nothing it could still do is wanted once the run is done with it
        (an idle one would only finish importing GX)."""
        try:
            self._process.kill()
            self._outbox.put(None)
            self._sender.join()
            self._process.wait()
        finally:
            os.close(self._from_helper)

    def _send_all(self) -> None:
        """Every queued table, then the end; nothing more once a write fails."""
        try:
            with suppress(OSError), os.fdopen(self._to_helper, "wb") as requests:
                # OSError: the helper is gone, which waiting for its reports says.
                while (message := self._outbox.get()) is not None:
                    pickle.dump(message, requests, protocol=pickle.HIGHEST_PROTOCOL)
                    requests.flush()
                    del message  # not the last table kept alive until the end
        except Exception as error:  # a table that cannot be pickled: the reports say so
            self._send_error = error

    def _report(self, request: int, suite: str) -> SuiteReport:
        # poll, not select: a long-lived step process may hold descriptors above select's 1024.
        replies = select.poll()
        replies.register(self._from_helper, select.POLLIN)
        while request not in self._reports:
            if replies.poll(_LIVENESS_SECONDS * 1000):
                try:
                    answered, report = pickle.loads(_read_message(self._from_helper))
                except (EOFError, OSError, pickle.UnpicklingError):
                    return self._died(suite)
                self._reports[answered] = report
            elif self._process.poll() is not None:
                return self._died(suite)
        return self._reports[request]

    def _died(self, suite: str) -> SuiteReport:
        if self._send_error is not None:
            reason = (
                f"the table could not be sent to the validation process: "
                f"{type(self._send_error).__name__}: {self._send_error}"
            )
            return unfinished_report(suite, reason)
        try:
            code = self._process.wait(_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            return unfinished_report(
                suite,
                f"the validation process (pid {self._process.pid}) sent a reply that could "
                "not be read; run the step again",
            )
        return unfinished_report(
            suite,
            f"the validation process (pid {self._process.pid}) ended with exit code {code} "
            "before reporting; run the step again, and if it ends so again, look for a lack "
            "of memory in the system log",
        )


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The helper's loop: GX first, then one report per table, until the run's end closes
    the requests."""
    from . import suites, validation  # noqa: F401  (the import this process exists for)

    while True:
        try:
            request, frame, suite, arguments = pickle.load(requests)
        except (EOFError, pickle.UnpicklingError):
            # The run is done with this helper, or its process died (mid-table, perhaps).
            return
        try:
            report = validate_suite(frame, suite, *arguments)
        except Exception as error:  # e.g. an unknown suite: a failed report, not a dead helper
            report = unfinished_report(suite, f"{type(error).__name__}: {error}")
        del frame  # not kept while the helper waits for the run's next table
        reply = pickle.dumps((request, report), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            replies.write(_LENGTH.pack(len(reply)) + reply)
            replies.flush()
        except BrokenPipeError:  # the step's process is gone: nobody wants the report
            return


def _read_message(fd: int) -> bytes:
    """One length-prefixed reply, read straight from the pipe: a buffered reader could hold
    the next reply where poll cannot see it."""
    (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size))
    return _read_exactly(fd, length)


def _read_exactly(fd: int, count: int) -> bytes:
    parts = []
    while count:
        part = os.read(fd, count)
        if not part:
            raise EOFError("the validation process closed its replies")
        parts.append(part)
        count -= len(part)
    return b"".join(parts)


class SuiteValidation:
    """Where one run's tables are validated: in a helper process once a large source has
    started one (GX is imported there, and every later table goes to it), else in this
    process. close() stops the helper."""

    def __init__(self) -> None:
        self._helper: ValidationProcess | None = None

    def for_source(self, source_bytes: int) -> Validator:
        """The validator for tables read from `source_bytes` of source: a helper started now
        for a source of at least HELPER_SOURCE_BYTES, unless one already runs."""
        if source_bytes >= HELPER_SOURCE_BYTES and self._running_helper() is None:
            self.close()  # a helper that died still holds its pipe and its sender thread
            self._helper = ValidationProcess()
        return self.validator()

    def validator(self) -> Validator:
        """The running helper, else validation in this process (after a helper died too: its
        owed reports say so, and the next table is validated here)."""
        return self._running_helper() or InProcessValidation()

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None

    def _running_helper(self) -> ValidationProcess | None:
        return self._helper if self._helper is not None and self._helper.exit_code is None else None


if __name__ == "__main__":
    with os.fdopen(int(sys.argv[1]), "rb") as requests, os.fdopen(int(sys.argv[2]), "wb") as out:
        _serve(requests, out)
