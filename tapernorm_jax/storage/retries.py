"""Bounded retries, with exponential backoff, of the copies to and from a remote run or study directory (`gs://...`).

A transient error (a dropped connection, a timeout, HTTP 408/429/5xx: `transient`) is retried up to
`$TAPERNORM_STORAGE_RETRIES` attempts in all (default 5), waiting `$TAPERNORM_STORAGE_BACKOFF_S` (default 1 s) after
the first failure, twice that after each next one, at most `MAX_DELAY_S`; each retry is logged in one line. A
permanent error (no such file, permission denied, a bad request, a full disk) is raised at once, as it is; one that
lasts past the attempts raises `StorageError`, which names the object, the attempts and the last error.

An upload is one whole-object call (`put_file`): an object store publishes an object only when its upload completes
(gcsfs cancels an unfinished one), so an interrupted upload leaves the previous version, or none, and the retry sends
the whole file again. (epath's own copy streams into a file object whose `close` would publish what was written so
far, even after an error.) gcsfs retries each HTTP request itself (6 tries, up to 32 s apart); these retries are
over whole copies, for outages that outlast its own.
"""

import errno
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

import fsspec
from etils import epath
from etils.epath import backend as epath_backend

from tapernorm_jax.errors import StoppedError

log = logging.getLogger(__name__)
T = TypeVar("T")

ATTEMPTS_ENV = "TAPERNORM_STORAGE_RETRIES"
BACKOFF_ENV = "TAPERNORM_STORAGE_BACKOFF_S"
ATTEMPTS = 5  # in all, the first included
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
PERMANENT_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError)
PERMANENT_ERRNOS = frozenset(
  {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG, errno.EINVAL}
)
EPATH_FILESYSTEMS = ("gs://", "s3://", "az://", "hf://")  # the URLs epath's fsspec backend opens itself


class StorageError(StoppedError, OSError):
  """A copy to or from remote storage that failed with a transient error on every attempt."""


def attempts() -> int:
  """How many times a copy is tried in all: $TAPERNORM_STORAGE_RETRIES, else ATTEMPTS."""
  text = os.environ.get(ATTEMPTS_ENV, "").strip()
  if not text:
    return ATTEMPTS
  if not text.isdigit() or int(text) < 1:
    raise ValueError(
      f"{ATTEMPTS_ENV}={text}: must be a whole number of attempts >= 1 (1: no retries); unset it for "
      f"the default {ATTEMPTS}"
    )
  return int(text)


def first_delay_s() -> float:
  """The wait after the first failure: $TAPERNORM_STORAGE_BACKOFF_S, else FIRST_DELAY_S."""
  text = os.environ.get(BACKOFF_ENV, "").strip()
  if not text:
    return FIRST_DELAY_S
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not 0 <= value <= MAX_DELAY_S:
    raise ValueError(
      f"{BACKOFF_ENV}={text}: must be seconds between 0 and {MAX_DELAY_S:g}; unset it for the default {FIRST_DELAY_S:g}"
    )
  return value


def delay_s(failures: int, first: float) -> float:
  """The wait after the `failures`-th failure in a row: `first`, doubled each time, at most MAX_DELAY_S."""
  return min(first * 2 ** (failures - 1), MAX_DELAY_S)


def http_status(error: BaseException) -> int | None:
  """The HTTP status an error carries (gcsfs's HttpError.code, aiohttp's .status, google-api-core's .code), if any."""
  for name in ("code", "status"):
    value = getattr(error, name, None)
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
      return int(value)
  return None


def transient(error: BaseException) -> bool:
  """Whether trying again may succeed: a dropped connection, a timeout, HTTP 408/429/5xx, another I/O error; not a
  missing file, a refused permission (gcsfs's `Forbidden` 403), a bad request or a full disk."""
  if isinstance(error, PERMANENT_OS_ERRORS) or getattr(error, "errno", None) in PERMANENT_ERRNOS:
    return False
  if isinstance(error, OSError) and str(error).startswith("Forbidden"):  # gcsfs's HTTP 403
    return False
  if isinstance(error, (ConnectionError, TimeoutError)):
    return True
  if (status := http_status(error)) is not None:
    return status in TRANSIENT_HTTP
  if type(error).__module__.split(".")[0] == "aiohttp" or type(error).__name__ == "ChecksumError":
    return True  # what gcsfs gives up on after its own retries: a dropped or corrupted transfer
  return isinstance(error, OSError)


def one_line(error: BaseException) -> str:
  """`Type: message` on one line."""
  text = " ".join(str(error).split())
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def call(fn: Callable[[], T], what: str) -> T:
  """`fn()`, tried again after each transient error up to `attempts()` times in all, with a growing wait between
  tries; `what` names the object and the action in the log and the error (`gs://b/run/results.json: upload`)."""
  total, first, start = attempts(), first_delay_s(), time.monotonic()
  for attempt in range(1, total + 1):
    try:
      return fn()
    except Exception as e:  # noqa: BLE001 (a permanent error is raised again as it is)
      if not transient(e):
        raise
      if attempt == total:
        raise StorageError(
          f"{what} failed {total} time{'s' * (total > 1)} over {time.monotonic() - start:.0f} s, the last with "
          f"{one_line(e)}; the storage is unreachable or failing: check the network and the bucket, then run the "
          f"same command again (a run resumes from its last checkpoint); {ATTEMPTS_ENV} sets the attempts "
          f"(now {total})"
        ) from e
      wait = delay_s(attempt, first)
      log.warning("%s failed (attempt %d of %d): %s; trying again in %.1f s", what, attempt, total, one_line(e), wait)
      time.sleep(wait)
  raise AssertionError("unreachable")


def filesystem(url: str) -> fsspec.AbstractFileSystem:
  """The fsspec filesystem of `url`: for gs://, s3://, az:// and hf:// the one epath's fsspec backend uses."""
  if url.startswith(EPATH_FILESYSTEMS):
    return epath_backend.fsspec_backend.fs(url)
  return fsspec.filesystem(url.split("://", 1)[0])


def copy(source: epath.Path, target: epath.Path) -> None:
  """Copies the file `source` to `target` (overwritten), retried whole (`call`): a local file to a URL is uploaded
  in one whole-object call, anything else copied by epath."""
  src, dst = os.fspath(source), os.fspath(target)
  if "://" in dst and "://" not in src:
    call(lambda: filesystem(dst).put_file(src, dst), f"{dst}: upload")
  else:
    what = f"{src}: download" if "://" in src else f"{dst}: copy"
    call(lambda: source.copy(target, overwrite=True), what)
