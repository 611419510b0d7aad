"""Atomic file writes: a reader never sees half a file, a crash never leaves one."""

import json
import os
from typing import Any


def write_text_atomically(path: str, text: str) -> None:
  """Writes `text` to a temporary sibling of `path` and renames it into place."""
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def write_json_atomically(path: str, obj: Any) -> None:
  """Writes `obj` as indented, key-sorted JSON, atomically."""
  write_text_atomically(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
