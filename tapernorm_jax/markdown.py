"""Markdown tables for benchmark and study reports."""

from collections.abc import Sequence
from typing import Any


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A GitHub-flavoured markdown table; cells are formatted with `str`."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in rows:
    if len(row) != len(header):
      raise ValueError(f"a table row has {len(row)} cells, the header {len(header)}: {row!r}")
    lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
  return "\n".join(lines)
