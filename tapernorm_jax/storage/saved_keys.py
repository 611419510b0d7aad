"""The paths of the tree an Orbax checkpoint item holds, read from its `_METADATA` file without reading an array:
what tells a restore which layout (or which version's names) a checkpoint was written in."""

import ast
import json
from typing import Any


def saved_keys(item_dir: Any) -> list[tuple[str, ...]] | None:
  """Every leaf's path in the item at `item_dir` (a local path or an `etils.epath.Path`); None where the metadata is
  absent or unreadable (a restore then reports the damage)."""
  path = item_dir / "_METADATA"
  if not path.exists():
    return None
  try:
    keys = json.loads(path.read_text()).get("tree_metadata", {})
    return [tuple(ast.literal_eval(key)) for key in keys]
  except (ValueError, SyntaxError):
    return None
