"""Cache directories built atomically: in a temporary sibling, marked `COMPLETE`, renamed into place.

An interrupted build leaves nothing a later run would read as complete; a directory without
the marker is never trusted and is rebuilt.
"""

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

COMPLETE = "COMPLETE"

log = logging.getLogger(__name__)


def digest(key: dict) -> str:
  """A short hash of a JSON-ready key: equal keys, equal digests."""
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def slug(name: str) -> str:
  """`name` as a safe, short directory-name prefix."""
  return re.sub(r"[^A-Za-z0-9.=,-]+", "_", name)[:80].strip("_")


def is_complete(directory: Path) -> bool:
  """Whether `directory` was finished by `build_atomically`."""
  return (directory / COMPLETE).exists()


def build_atomically(final: Path, build: Callable[[Path], None]) -> None:
  """Runs `build(tmp)` in a temporary sibling of `final`, marks it complete and renames it into place."""
  final.parent.mkdir(parents=True, exist_ok=True)
  if is_complete(final):  # another process finished it meanwhile
    return
  if final.exists():  # no COMPLETE marker: left by something other than this function; never trusted
    log.warning("removing incomplete prepared data at %s", final)
    shutil.rmtree(final)
  tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
  try:
    build(tmp)
    (tmp / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
    try:
      os.rename(tmp, final)
    except OSError:
      if not is_complete(final):  # another process finished first: keep theirs
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
