"""One process at a time in a run or study directory, and the temporary files of writers that are gone removed when
the next one starts.

    with hold(directory, "--workdir") as removed: ...   refuses (DirectoryInUseError) a directory another process
                                                         holds; `removed` lists the leftovers it deleted

A local directory is held by an flock on `DIR/.lock`: the kernel (or NFS's lock manager) releases it when its process
ends, however it ends, so whether a writer is alive is never guessed from a pid. A directory at a URL (gs://), where
nothing can be locked, holds a lease in `DIR/.lock` that a thread renews every RENEW_S seconds: a holder on another
host is gone once its lease is EXPIRE_S old; one on this host as soon as its process is.

Leftovers are the staging files of `run_files.atomic_path` (`NAME.tmp-<pid>`) under the directory; they are written only
by the process holding it (a subdirectory with a holder of its own, a study's running cell, is skipped), so once it is
held, every one of them belongs to a writer that is gone.
"""

import contextlib
import fcntl
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from etils import epath

from tapernorm_jax.storage import run_files
from tapernorm_jax.errors import UserError

LOCK_FILE = ".lock"
STAGING = re.compile(r"\.tmp-\d+$")  # run_files.staging_path's names
RENEW_S = 60.0  # how often a lease at a URL is renewed
EXPIRE_S = 300.0  # a lease at a URL not renewed for this long belongs to a process that is gone


class DirectoryInUseError(UserError, RuntimeError):
  """Another live process holds the run or study directory."""


def holder() -> dict[str, Any]:
  """Who this process is, as a lock file records it."""
  return {
    "host": socket.gethostname(),
    "pid": os.getpid(),
    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    "renewed": time.time(),
  }


def alive_here(record: dict[str, Any]) -> bool:
  """Whether the process a lock record names runs on this host (only a pid of this host is ever checked)."""
  if record.get("host") != socket.gethostname():
    return False
  try:
    os.kill(int(record["pid"]), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, KeyError, ValueError, TypeError):
    return True  # a live process of another user, or a record that does not say: not provably gone
  return True


def describe(record: dict[str, Any]) -> str:
  """'pid 123 on host h, since …' from a lock record (or what is known of it)."""
  return f"pid {record.get('pid', '?')} on host {record.get('host', '?')}, since {record.get('since', '?')}"


def in_use(directory: epath.Path, flag: str, record: dict[str, Any]) -> DirectoryInUseError:
  """The one-line refusal."""
  return DirectoryInUseError(
    f"{flag}={directory} is in use by another process ({describe(record)}); two processes "
    "writing one directory would corrupt it. Wait for that one to end or stop it, or use "
    "another directory"
  )


class LocalLock:
  """An flock on DIR/.lock, held until `release` (or until the process ends)."""

  def __init__(self, directory: epath.Path, flag: str):
    self.path, self.directory, self.flag = os.path.join(directory, LOCK_FILE), directory, flag
    self.fd: int | None = None

  def acquire(self) -> None:
    """Takes the lock or raises DirectoryInUseError naming its holder."""
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(fd)
        raise in_use(self.directory, self.flag, read_record(epath.Path(self.path))) from None
      if same_file(fd, self.path):
        break
      os.close(fd)  # locked a file its holder removed on release: lock the one at the path now
    self.fd = fd
    os.ftruncate(fd, 0)  # who holds it, for the refusal's message (never read for liveness)
    os.write(fd, (json.dumps(holder()) + "\n").encode())

  def release(self) -> None:
    """Removes the lock file, then releases the lock (a process that opened the file meanwhile sees it gone)."""
    if self.fd is not None:
      with contextlib.suppress(FileNotFoundError):
        os.remove(self.path)
      os.close(self.fd)
      self.fd = None


def same_file(fd: int, path: str) -> bool:
  """Whether the open file `fd` is still the file at `path`."""
  try:
    return os.path.samestat(os.fstat(fd), os.stat(path))
  except FileNotFoundError:
    return False


class RemoteLease:
  """A lease in DIR/.lock at a URL, renewed by a daemon thread until `release`."""

  def __init__(self, directory: epath.Path, flag: str):
    self.path, self.directory, self.flag = directory / LOCK_FILE, directory, flag
    self.record = holder()
    self.stop = threading.Event()
    self.thread: threading.Thread | None = None

  def acquire(self) -> None:
    """Takes the lease, or raises DirectoryInUseError when a live holder has it."""
    record = read_record(self.path)
    if record and (
      alive_here(record)
      or (record.get("host") != socket.gethostname() and time.time() - float(record.get("renewed", 0)) < EXPIRE_S)
    ):
      raise in_use(self.directory, self.flag, record)
    self.write()
    self.thread = threading.Thread(target=self.renew, daemon=True, name=f"lease {self.directory}")
    self.thread.start()

  def write(self) -> None:
    """Uploads the lease with the time now."""
    self.record["renewed"] = time.time()
    run_files.write_json_atomically(self.path, self.record)

  def renew(self) -> None:
    """Renews the lease every RENEW_S seconds until released; a failed renewal is tried again at the next one."""
    while not self.stop.wait(RENEW_S):
      with contextlib.suppress(OSError):
        self.write()

  def release(self) -> None:
    """Stops renewing and removes the lease."""
    self.stop.set()
    if self.thread:
      self.thread.join()
      with contextlib.suppress(OSError):
        self.path.unlink()


def read_record(path: epath.Path) -> dict[str, Any]:
  """A lock file's record, or {} where there is none or it cannot be read."""
  try:
    record = json.loads(path.read_text())
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def held_elsewhere(directory: str) -> bool:
  """Whether another process holds the local `directory` now (its lock cannot be taken)."""
  path = os.path.join(directory, LOCK_FILE)
  if not os.path.exists(path):
    return False
  fd = os.open(path, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  finally:
    os.close(fd)


def remove_leftovers(directory: epath.Path) -> list[str]:
  """Deletes the staging files under the local `directory`, skipping subdirectories another process holds; returns
  their paths."""
  removed = []
  for root, dirs, names in os.walk(directory):
    dirs[:] = [d for d in dirs if not held_elsewhere(os.path.join(root, d))]
    for name in names:
      if STAGING.search(name):
        os.remove(os.path.join(root, name))
        removed.append(os.path.join(root, name))
  return removed


@contextlib.contextmanager
def hold(directory: str | os.PathLike, flag: str) -> Iterator[list[str]]:
  """Holds `directory` (created) for the block, after removing the leftovers of writers that are gone (yielded);
  raises DirectoryInUseError, naming the holder, where another live process holds it."""
  path = run_files.workdir_path(directory)
  path.mkdir(parents=True, exist_ok=True)
  lock = RemoteLease(path, flag) if run_files.is_url(path) else LocalLock(path, flag)
  lock.acquire()
  try:
    yield [] if run_files.is_url(path) else remove_leftovers(path)
  finally:
    lock.release()
