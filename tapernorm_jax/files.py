"""Atomic file writes: a reader never sees half a file, a crash never leaves one."""

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
  """A temporary sibling of `path` to write (by any writer); renamed into place when the block succeeds."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_text_atomically(path: str, text: str) -> None:
  """Writes `text` to a temporary sibling of `path` and renames it into place."""
  with atomic_path(path) as tmp, open(tmp, "w") as f:
    f.write(text)


def write_json_atomically(path: str, obj: Any) -> None:
  """Writes `obj` as indented, key-sorted JSON, atomically."""
  write_text_atomically(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
