"""Run-directory files, local or remote (`gs://bucket/run`, any etils.epath URL), and atomic writes.

Every read and write in a run or export directory goes through `workdir_path`, an `etils.epath.Path`:
a local path is expanded and made absolute, a URL is left as it is (gs:// needs the `gcs` extra).
Local-only settings (the prepared-data cache) go through `local_path`, which refuses a URL by name.

Atomic writes: locally the file is written as a temporary sibling and renamed into place (a reader
never sees half a file, a crash never leaves one). An object store has no atomic rename (it is a
copy and a delete) but publishes an object only when its upload completes, so there the file is
written locally and uploaded in one piece, straight to its name. Writers that only write local files
or that append (TensorBoard's, the profiler's, metrics.jsonl) write into a `Mirror`: a local
directory whose files are uploaded whole to the remote one. Each copy to or from a URL is retried whole, with
backoff, after a transient error (`retries.py`).
"""

import contextlib
import errno
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
from etils import epath

from tapernorm_jax.storage import retries
from tapernorm_jax.errors import StoppedError, UserError


class LocalPathError(UserError, ValueError):
  """A setting that must name a local directory was given a URL."""


def is_url(path: str | os.PathLike) -> bool:
  """Whether `path` is a URL (`gs://...`) rather than a local path."""
  return "://" in os.fspath(path)


class MissingFilesystemError(UserError, ImportError):
  """A URL whose filesystem (gcsfs for gs://, s3fs for s3://) is not installed, or that epath does not know."""


def workdir_path(path: str | os.PathLike) -> epath.Path:
  """`path` as an epath.Path: a URL as it is (its filesystem must be installed), a local path with `~` expanded,
  made absolute."""
  text = os.fspath(path)
  if not is_url(text):
    return epath.Path(os.path.abspath(os.path.expanduser(text)))
  protocol = text.split("://", 1)[0]
  try:
    fsspec.get_filesystem_class(protocol)  # imports gcsfs for gs://: what epath's backend will use
    return epath.Path(text)
  except (ImportError, ValueError, KeyError) as e:
    raise MissingFilesystemError(
      f"{text}: no filesystem for {protocol}:// is installed ({e}); for gs:// install the "
      "gcs extra: pip install 'tapernorm_jax[gcs]'"
    ) from e


class DiskFullError(StoppedError, OSError):
  """A write that found no space left on its device (or its quota spent)."""


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
FULL_DISK_WORDS = ("No space left on device", "Disk quota exceeded")  # how TensorStore and others say it in text


def is_full_disk(error: BaseException) -> bool:
  """Whether `error`, or an error it was raised from, says the disk or the quota is full."""
  while error is not None:
    if (isinstance(error, OSError) and error.errno in FULL_DISK) or any(w in str(error) for w in FULL_DISK_WORDS):
      return True
    error = error.__cause__ or error.__context__
  return False


def in_bytes(count: float) -> str:
  """A byte count for people: '512 B', '3.4 MB'."""
  for unit in ("B", "kB", "MB", "GB"):
    if count < 1000 or unit == "GB":
      return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
    count /= 1000
  return ""


def free_bytes(path: str | os.PathLike) -> int | None:
  """Free bytes on the local device holding `path` (its nearest existing parent), None for a URL."""
  if is_url(path):
    return None
  path = os.path.abspath(os.fspath(path))
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


@contextlib.contextmanager
def full_disk_named(
  what: str, path: str | os.PathLike, needed: int | None = None, written: Callable[[], int] | None = None
) -> Iterator[None]:
  """Turns a full disk inside the block into one DiskFullError: what was being written, where, the space it needs
  (`needed` bytes where known, else more than the bytes `written` reports) and the space free."""
  try:
    yield
  except DiskFullError:
    raise
  except Exception as e:
    if not is_full_disk(e):
      raise
    size = in_bytes(needed) if needed else f"more than the {in_bytes(written())} written" if written else "more"
    raise DiskFullError(full_disk_message(what, path, size, free_bytes(path))) from None


def full_disk_message(what: str, path: str | os.PathLike, size: str, free: int | None) -> str:
  """The one line of a full disk: what was (to be) written, where, the space it needs, the space free, the fix."""
  return (
    f"no space left for {what} in {path} (it needs {size}{'' if free is None else f'; {in_bytes(free)} free'})."
    " Free space there (or move the directory), then run the same command again: what was complete before is "
    "intact, and a run resumes from its newest complete checkpoint"
  )


def cache_dir() -> str:
  """Where prepared data, downloads and built kernels go by default: $TAPERNORM_CACHE, else ~/.cache/tapernorm_jax."""
  return os.environ.get("TAPERNORM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tapernorm_jax")


def local_path(path: str | os.PathLike, field: str) -> pathlib.Path:
  """A local directory setting with `~` expanded; a URL raises LocalPathError naming `field`."""
  text = os.fspath(path)
  if is_url(text):
    raise LocalPathError(
      f"{field}={text}: must be a local directory (it is read and written by local tools); give "
      "a path on this machine, e.g. the default ~/.cache/tapernorm_jax"
    )
  return pathlib.Path(os.path.expanduser(text))


def staging_path(path: str | os.PathLike) -> str:
  """Where `path` is written before it is moved into place: beside it, named `PATH.tmp-PID`."""
  return f"{path}.tmp-{os.getpid()}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, needed: int | None = None) -> Iterator[str]:
  """A local temporary file to write (by any writer) that becomes `path` when the block succeeds: renamed into
  place locally, uploaded in one piece to a URL. A full disk is a DiskFullError naming `path` and the `needed`
  bytes (where the caller knows them), and leaves `path` as it was."""
  if is_url(path):
    fd, tmp = tempfile.mkstemp(prefix="tapernorm-upload-")
    os.close(fd)
  else:
    tmp = staging_path(path)
  try:
    with full_disk_named(
      os.path.basename(path), os.path.dirname(tmp), needed, lambda: os.path.getsize(tmp) if os.path.exists(tmp) else 0
    ):
      yield tmp
    if is_url(path):
      retries.copy(epath.Path(tmp), workdir_path(path))  # one whole-object upload, retried whole
    else:
      os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
  """Writes `text` to a temporary file and moves it to `path` (see `atomic_path`)."""
  with atomic_path(path, needed=len(text.encode())) as tmp, open(tmp, "w") as f:
    f.write(text)


def read_json(path: str | os.PathLike) -> Any | None:
  """A local JSON file's content, or None where there is no such file."""
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def write_json_atomically(path: str | os.PathLike, obj: Any) -> None:
  """Writes `obj` as indented, key-sorted JSON, atomically."""
  write_text_atomically(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_report(directory: str | os.PathLike, results: Any, markdown: str, name: str = "table.md") -> str:
  """Writes `results.json` and the markdown `name` into `directory` (created); returns the JSON's path."""
  os.makedirs(directory, exist_ok=True)
  write_json_atomically(os.path.join(directory, "results.json"), results)
  write_text_atomically(os.path.join(directory, name), markdown + "\n")
  return os.path.join(directory, "results.json")


def upload_tree(local: str | os.PathLike, remote: epath.Path) -> None:
  """Copies every file under the local directory `local` to the same relative path under `remote`."""
  for root, _, names in os.walk(local):
    target = remote / os.path.relpath(root, local)
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
      retries.copy(epath.Path(root, name), target / name)


def download_tree(remote: epath.Path, local: pathlib.Path | None = None) -> pathlib.Path:
  """Copies every file under `remote` into `local` (default: a new temporary directory); returns it."""
  local = local or pathlib.Path(tempfile.mkdtemp(prefix="tapernorm-download-"))
  local.mkdir(parents=True, exist_ok=True)
  for item in remote.iterdir():
    if item.is_dir():
      download_tree(item, local / item.name)
    else:
      retries.copy(item, epath.Path(local / item.name))
  return local


class Mirror:
  """A local staging directory for `remote`; `upload` copies the files changed since the last upload, whole."""

  def __init__(self, remote: epath.Path):
    self.remote = remote
    self.local = epath.Path(tempfile.mkdtemp(prefix="tapernorm-mirror-"))
    self._uploaded: dict[str, tuple[int, int]] = {}

  def download(self, name: str) -> None:
    """Copies the remote file `name`, if there is one, into the staging directory (to append to it)."""
    source = self.remote / name
    if source.exists():
      retries.copy(source, self.local / name)
      self._uploaded[name] = self._stamp(name)

  def upload(self) -> None:
    """Uploads every staged file that is new or changed."""
    for root, _, names in os.walk(self.local):
      for name in names:
        relative = os.path.relpath(os.path.join(root, name), self.local)
        if self._uploaded.get(relative) != (stamp := self._stamp(relative)):
          (self.remote / relative).parent.mkdir(parents=True, exist_ok=True)
          retries.copy(self.local / relative, self.remote / relative)
          self._uploaded[relative] = stamp

  def close(self) -> None:
    """Uploads what changed and removes the staging directory."""
    self.upload()
    shutil.rmtree(self.local, ignore_errors=True)

  def _stamp(self, relative: str) -> tuple[int, int]:
    """(size, mtime) of a staged file: what tells a changed file."""
    stat = os.stat(self.local / relative)
    return stat.st_size, stat.st_mtime_ns
