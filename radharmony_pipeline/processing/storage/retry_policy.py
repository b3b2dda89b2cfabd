"""The retry policy of object-store requests: bounded attempts with exponential backoff,
carried in a path's options (`RETRY_OPTION`) so that worker processes apply the same one.

A leaf module: it imports nothing from the package, so store.py, source_store.py and the
adapter (internals.py, whose s3 path keeps the option from s3fs) all import it.
"""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from upath import UPath

T = TypeVar("T")

# The storage option that carries the retry policy with a path; s3fs never sees it.
RETRY_OPTION = "radharmony_retry_policy"
# Error codes of throttling and of a store that is busy or restarting (S3's and common
# S3-compatible stores'), whatever the HTTP status they come with.
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "TooManyRequests",
}


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded attempts per object-store operation, with exponential backoff between them
    (`first_backoff`, doubling, at most `max_backoff` seconds). Throttling, 5xx answers,
    timeouts and cut connections are retried; anything else fails at once."""

    attempts: int = 8
    first_backoff: float = 0.25
    max_backoff: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_backoff < 0 or self.max_backoff < 0:
            raise ValueError(
                "a retry policy needs at least 1 attempt and non-negative backoffs, got "
                f"{self.attempts} attempts, {self.first_backoff} s, {self.max_backoff} s"
            )

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after the `failed_attempts`-th failure."""
        return min(self.first_backoff * 2 ** (failed_attempts - 1), self.max_backoff)

    def budget(self) -> float:
        """The total time waited between attempts before giving up."""
        return sum(self.backoff(n) for n in range(1, self.attempts))


DEFAULT_RETRY_POLICY = RetryPolicy()


class ObjectStoreError(RuntimeError):
    """An object-store operation failed for good: a permanent answer (access denied, no such
    bucket) or transient faults past the retry policy. Not an OSError, so that no caller
    turns it into an error row or a "missing, write it again": it stops the step."""


def is_local(path: Any) -> bool:
    return not isinstance(path, UPath) or path.protocol in ("", "file", "local")


def retry_policy_of(path: Any) -> RetryPolicy:
    option = getattr(path, "storage_options", {}).get(RETRY_OPTION)
    return RetryPolicy(*option) if option else DEFAULT_RETRY_POLICY


def with_retries(path: Any, action: str, operation: Callable[[], T]) -> T:
    """`operation()` (an object-store request or a few, about `path`) under the path's retry
    policy. A permanent error, or transient ones past the policy, raise ObjectStoreError
    naming the object and the cause; a missing object stays FileNotFoundError. Local paths
    call `operation` once."""
    if is_local(path):
        return operation()
    policy = retry_policy_of(path)
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return operation()
        except Exception as error:
            problem = store_problem(error)
            if problem is None:
                raise
            if problem != _TRANSIENT:
                raise ObjectStoreError(f"{path}: cannot {action}: {problem}") from error
            if attempt == policy.attempts:
                waited = time.monotonic() - started
                raise ObjectStoreError(
                    f"{path}: cannot {action}: the object store kept failing ({error!r}) "
                    f"through {policy.attempts} attempts over {waited:.1f} s. Once the store "
                    "answers again, run the same command: finished outputs are kept"
                ) from error
            time.sleep(policy.backoff(attempt))
    raise AssertionError("unreachable")


_TRANSIENT = "transient"


def store_problem(error: BaseException) -> str | None:
    """`_TRANSIENT` for a fault worth retrying, a description of a permanent store error
    (access denied, no such bucket), or None for anything else (a missing object, a bug)."""
    for cause in _causes(error):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and "Error" in response:
            code = response["Error"].get("Code", "")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in _TRANSIENT_CODES or status >= 500 or status == 429:
                return _TRANSIENT
            if code == "NoSuchBucket":
                return f"the bucket does not exist (NoSuchBucket): {cause}"
            if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId"):
                named = f", {code}" if code and code != str(status) else ""
                return f"access denied (HTTP {status}{named}): {cause}. Check the credentials"
            return None
        if _is_connection_fault(cause):
            return _TRANSIENT
    if isinstance(error, PermissionError):
        return f"access denied: {error}. Check the credentials"
    return None


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_connection_fault(error: BaseException) -> bool:
    if isinstance(error, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return True
    if isinstance(error, http.client.HTTPException):  # IncompleteRead, RemoteDisconnected
        return True
    package = type(error).__module__.split(".")[0]
    if package == "aiohttp":  # ClientPayloadError, ServerDisconnectedError, ClientOSError
        return True
    if package == "botocore":
        import botocore.exceptions as boto

        return isinstance(
            error, (boto.HTTPClientError, boto.ConnectionError, boto.IncompleteReadError)
        )
    return type(error).__name__ == "FSTimeoutError"
