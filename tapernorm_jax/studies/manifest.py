"""What a study directory records: DIR/sweep.json (the expanded grid), DIR/<cell>/cell.json (what the runner last did
with a cell) and, read from those and the run's own files, where each cell stands. DIR is a local path or a URL
(`gs://...`): every read and write goes through `files.workdir_path`."""

import dataclasses
import difflib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tapernorm_jax.storage import integrity
from tapernorm_jax.storage.run_files import workdir_path, write_json_atomically
from tapernorm_jax.studies.spec import Cell, SweepError

MANIFEST = "sweep.json"  # DIR/sweep.json: the expanded grid, so a report knows which cells are missing
CELL_RECORD = "cell.json"  # DIR/<cell>/cell.json: what the runner last did with the cell (status, error, devices)
RESULTS_SCHEMAS = (0, 1)  # results.json schemas this module reads; a missing `schema` field is schema 0


@dataclasses.dataclass(frozen=True)
class CellStatus:
  """Where a cell stands: `complete`, `failed`, `incomplete` (started, not finished) or `pending`."""

  state: str
  step: int = 0  # the last step with metrics (incomplete cells)
  error: str = ""  # failed cells: `Type: message`
  results: Mapping[str, Any] | None = None  # complete cells


def write_manifest(workdir: str, sweep: Mapping[str, Any], cells: Sequence[Cell], source: str = "") -> None:
  """Writes DIR/sweep.json: the sweep's name and source file and every cell of the grid."""
  workdir_path(workdir).mkdir(parents=True, exist_ok=True)
  write_json_atomically(
    os.path.join(workdir, MANIFEST),
    {"name": sweep.get("name", ""), "source": source, "cells": [c.to_json() for c in cells]},
  )


def read_manifest(workdir: str) -> dict[str, Any] | None:
  """DIR/sweep.json, or None when the directory was not made by a sweep."""
  return read_json(os.path.join(workdir, MANIFEST))


def read_json(path: str) -> Any:
  """The JSON file at `path` (local or a URL), or None when there is none."""
  file = workdir_path(path)
  return json.loads(file.read_text()) if file.exists() else None


def manifest_cells(workdir: str) -> dict[str, Cell]:
  """The cells DIR/sweep.json names, by name ({} without a manifest)."""
  manifest = read_manifest(workdir) or {"cells": []}
  return {entry["name"]: Cell.from_json(entry) for entry in manifest["cells"]}


def find_cell(study: str, name: str) -> Cell:
  """The cell `name` of the study in `study`; no manifest, or no such cell in it, is a SweepError naming the flag."""
  path = os.path.join(study, MANIFEST)
  if not workdir_path(path).is_file():
    where = f"no {MANIFEST} in it" if workdir_path(study).is_dir() else "no such directory"
    raise SweepError(
      f"--study={study}: {where}; give the --workdir of the sweep that printed this command "
      f"(python -m experiments.sweep writes DIR/{MANIFEST})"
    )
  cells = manifest_cells(study)
  if name not in cells:
    hint = difflib.get_close_matches(name, list(cells), n=1)
    names = ", ".join(list(cells)[:3]) + (", …" if len(cells) > 3 else "")
    raise SweepError(
      f"--cell={name}: {path} has no such cell; "
      + (
        f"did you mean --cell={hint[0]}?"
        if hint
        else f"its cells are {names or 'none'} (DIR/commands.txt has a command line for each pending one)"
      )
    )
  return cells[name]


def read_results(run_dir: str) -> dict[str, Any] | None:
  """`results.json` of a run directory, or None when absent; a schema this module cannot read, or a file that does not
  match its seal (integrity.seal), is a ValueError."""
  path = os.path.join(run_dir, "results.json")
  results = read_json(path)
  if results is None:
    return None
  results, problem = integrity.unseal(results)
  if problem:
    raise ValueError(
      f"{path} is damaged: {problem}; run the cell again (the sweep's next launch does, or the cell's "
      "own command): its final checkpoint is evaluated again, nothing is retrained"
    )
  schema = results.get("schema", 0)
  if schema not in RESULTS_SCHEMAS:
    raise ValueError(f"{path}: schema={schema!r}, this code reads schemas {RESULTS_SCHEMAS}")
  return results


def read_record(run_dir: str) -> dict[str, Any]:
  """DIR/<cell>/cell.json, or {} when the runner never touched the cell."""
  return read_json(os.path.join(run_dir, CELL_RECORD)) or {}


def write_record(run_dir: str, record: Mapping[str, Any]) -> None:
  """Writes DIR/<cell>/cell.json."""
  write_json_atomically(os.path.join(run_dir, CELL_RECORD), dict(record))


def last_step(run_dir: str) -> int:
  """The step of the last record in `metrics.jsonl` + 1 (0 when none), read from the file's tail."""
  path = workdir_path(os.path.join(run_dir, "metrics.jsonl"))
  if not path.exists():
    return 0
  with path.open("rb") as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - 65536))
    lines = [line for line in f.read().splitlines() if line.strip()]
  for line in reversed(lines):
    try:
      return int(json.loads(line)["step"]) + 1
    except (ValueError, KeyError):  # a partial first line of the tail
      continue
  return 0


def cell_status(run_dir: str) -> CellStatus:
  """Complete (results.json says so), failed (the runner recorded an error), incomplete or pending."""
  try:
    results = read_results(run_dir)
  except (ValueError, OSError) as e:
    return CellStatus("failed", error=f"unreadable results: {e}")
  if results is not None and results.get("complete"):
    return CellStatus("complete", step=int(results.get("steps", 0)), results=results)
  record = read_record(run_dir)
  if record.get("status") == "failed":
    return CellStatus("failed", step=last_step(run_dir), error=record.get("error", "?"))
  step = last_step(run_dir)
  started = step > 0 or workdir_path(os.path.join(run_dir, "checkpoints")).is_dir()
  return CellStatus("incomplete" if started else "pending", step=step)
