"""Scaling sweeps: a grid of variants × sizes × seeds as cells, run in-process (packed onto devices, failures
isolated, resumable) or printed as one command line per cell for a cluster scheduler."""

import dataclasses
import json
import os
import queue
import shlex
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self, TextIO

import jax
import ml_collections

from tapernorm_jax.errors import UserError
from tapernorm_jax.files import write_json_atomically, write_text_atomically
from tapernorm_jax.taper.variants import SIZES, VARIANTS
from tapernorm_jax.train import run_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
MANIFEST = "sweep.json"  # DIR/sweep.json: the expanded grid, so a report knows which cells are missing
CELL_RECORD = "cell.json"  # DIR/<cell>/cell.json: what the runner last did with the cell (status, error, devices)
CELL_LOG = "log.txt"  # DIR/<cell>/log.txt: the cell's own output (its progress bar, warnings)
RESULTS_SCHEMAS = (0, 1)  # results.json schemas this module reads; a missing `schema` field is schema 0
RunFn = Callable[..., dict]  # loop.run's signature: (cfg, workdir, *, devices) -> results


class SweepError(UserError, ValueError):
  """A bad sweep file, flag or grid; the message names the field and its value."""


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid: a variant with its aux setting, a size, a seed and the config overrides."""

  variant: str
  size: str
  aux: int
  seed: int
  overrides: tuple[tuple[str, Any], ...] = ()  # (dotted config key, value), sorted by key

  @property
  def name(self) -> str:
    """`<variant>-<size>-aux<0|1>-seed<N>`, the same name `experiments.tinystories` gives its default workdir."""
    return f"{self.variant}-{self.size}-aux{self.aux}-seed{self.seed}"

  @property
  def config_arg(self) -> str:
    """The argument after `:` in `--config=configs/<variant>.py:<arg>`."""
    return f"size={self.size},aux={self.aux},seed={self.seed}"

  def config(self) -> ml_collections.ConfigDict:
    """The full run config: the variant file's config with the overrides applied."""
    cfg = run_config.get_config(self.variant, self.config_arg)
    for key, value in self.overrides:
      set_field(cfg, key, value)
    return cfg

  def to_json(self) -> dict[str, Any]:
    """A JSON-friendly description (the manifest and cell records hold it)."""
    return {"name": self.name, "variant": self.variant, "size": self.size, "aux": self.aux, "seed": self.seed,
            "overrides": dict(self.overrides)}


@dataclasses.dataclass(frozen=True)
class CellStatus:
  """Where a cell stands: `complete`, `failed`, `incomplete` (started, not finished) or `pending`."""

  state: str
  step: int = 0  # the last step with metrics (incomplete cells)
  error: str = ""  # failed cells: `Type: message`
  results: Mapping[str, Any] | None = None  # complete cells


# ---------------------------------------------------------------------------------------------------- the grid


def parse_variant(spec: Any, where: str) -> tuple[str, int]:
  """`all_taper:aux=1` → ("all_taper", 1); a bare variant takes its default aux setting."""
  if not isinstance(spec, str):
    raise SweepError(f"{where}={spec!r}: a variant is a string like 'all_taper' or 'all_taper:aux=0'")
  variant, _, rest = spec.partition(":")
  if variant not in VARIANTS:
    raise SweepError(f"{where}={spec!r}: unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
  if not rest:
    return variant, int(VARIANTS[variant][2])
  if rest not in ("aux=0", "aux=1"):
    raise SweepError(f"{where}={spec!r}: after ':' write aux=0 or aux=1")
  return variant, int(rest[-1])


def is_mapping(value: Any) -> bool:
  """A dict or a ConfigDict (which is not a collections.abc.Mapping)."""
  return isinstance(value, (Mapping, ml_collections.ConfigDict))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"train": {"steps": 5}} → {"train.steps": 5}."""
  flat: dict[str, Any] = {}
  for key, value in tree.items():
    if is_mapping(value):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def set_field(cfg: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """Sets `cfg.<key>` (dotted) as `--config.<key>=` would; an unknown field or a wrong type is a SweepError."""
  *sections, field = key.split(".")
  node = cfg
  for i, section in enumerate(sections):
    if not isinstance(node, ml_collections.ConfigDict) or section not in node:
      raise SweepError(f"overrides.{key}={value!r}: {'.'.join(sections[:i + 1])} is not a config section")
    node = node[section]
  if not isinstance(node, ml_collections.ConfigDict) or field not in node:
    raise SweepError(f"overrides.{key}={value!r}: no such config field")
  try:
    node[field] = value
  except (TypeError, ValueError) as e:
    raise SweepError(f"overrides.{key}={value!r}: {e}") from None


def _as_list(value: Any, where: str) -> list:
  """A list or tuple field of the sweep file, or a SweepError."""
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
    raise SweepError(f"{where}={value!r}: expected a non-empty list")
  return list(value)


def expand(sweep: Mapping[str, Any]) -> list[Cell]:
  """The cells of a sweep file's config, in grid order; checks every name, value and override first."""
  known = {"name", "grids", "seeds", "overrides"}
  if not is_mapping(sweep):
    raise SweepError(f"the sweep file's get_config() returned {type(sweep).__name__}, not a ConfigDict or dict")
  for key in sweep:
    if key not in known:
      raise SweepError(f"{key}: not a sweep field (the fields are {', '.join(sorted(known))})")
  shared = flatten(sweep.get("overrides") or {})
  cells: dict[str, Cell] = {}
  for g, grid in enumerate(_as_list(sweep.get("grids"), "grids")):
    where = f"grids[{g}]"
    if not is_mapping(grid):
      raise SweepError(f"{where}={grid!r}: expected a dict with variants, sizes, seeds (optional), overrides")
    for key in grid:
      if key not in ("variants", "sizes", "seeds", "overrides"):
        raise SweepError(f"{where}.{key}: not a grid field (variants, sizes, seeds, overrides)")
    variants = [parse_variant(v, f"{where}.variants[{i}]")
                for i, v in enumerate(_as_list(grid.get("variants"), f"{where}.variants"))]
    sizes = _as_list(grid.get("sizes"), f"{where}.sizes")
    for i, size in enumerate(sizes):
      if size not in SIZES:
        raise SweepError(f"{where}.sizes[{i}]={size!r}: unknown size; known: {', '.join(SIZES)}")
    seeds = _as_list(grid.get("seeds", sweep.get("seeds")), f"{where}.seeds (or the sweep's seeds)")
    for i, seed in enumerate(seeds):
      if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SweepError(f"{where}.seeds[{i}]={seed!r}: seeds are non-negative integers")
    merged = {**shared, **flatten(grid.get("overrides") or {})}
    overrides = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in merged.items()))
    for size in sizes:
      for variant, aux in variants:
        for seed in seeds:
          cell = Cell(variant, size, aux, seed, overrides)
          if cell.name in cells and cells[cell.name] != cell:
            raise SweepError(f"{where}: cell {cell.name} appears twice with different overrides")
          cells[cell.name] = cell
  checked: set[tuple] = set()
  for cell in cells.values():  # one config per distinct (variant, size, aux, overrides) catches bad overrides
    key = (cell.variant, cell.size, cell.aux, cell.overrides)
    if key not in checked:
      checked.add(key)
      for name, value in cell.overrides:
        if "." not in name:
          raise SweepError(f"overrides.{name}={value!r}: set variants, sizes and seeds in the grid, not as overrides")
      if int(cell.config().taper.aux_weight > 0) != cell.aux:
        raise SweepError(f"overrides.taper.aux_weight={dict(cell.overrides)['taper.aux_weight']!r} contradicts "
                         f"{cell.variant}:aux={cell.aux}; choose the aux setting in the variant list")
  return list(cells.values())


def write_manifest(workdir: str, sweep: Mapping[str, Any], cells: Sequence[Cell], source: str = "") -> None:
  """Writes DIR/sweep.json: the sweep's name and source file and every cell of the grid."""
  os.makedirs(workdir, exist_ok=True)
  write_json_atomically(os.path.join(workdir, MANIFEST), {
      "name": sweep.get("name", ""), "source": source, "cells": [c.to_json() for c in cells]})


def read_manifest(workdir: str) -> dict[str, Any] | None:
  """DIR/sweep.json, or None when the directory was not made by a sweep."""
  path = os.path.join(workdir, MANIFEST)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


# ------------------------------------------------------------------------------------------------ cell status


def read_results(run_dir: str) -> dict[str, Any] | None:
  """`results.json` of a run directory, or None when absent; a schema this module cannot read is a ValueError."""
  path = os.path.join(run_dir, "results.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    results = json.load(f)
  schema = results.get("schema", 0)
  if schema not in RESULTS_SCHEMAS:
    raise ValueError(f"{path}: schema={schema!r}, this code reads schemas {RESULTS_SCHEMAS}")
  return results


def read_record(run_dir: str) -> dict[str, Any]:
  """DIR/<cell>/cell.json, or {} when the runner never touched the cell."""
  path = os.path.join(run_dir, CELL_RECORD)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def last_step(run_dir: str) -> int:
  """The step of the last record in `metrics.jsonl` + 1 (0 when none), read from the file's tail."""
  path = os.path.join(run_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path, "rb") as f:
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
  started = step > 0 or os.path.isdir(os.path.join(run_dir, "checkpoints"))
  return CellStatus("incomplete" if started else "pending", step=step)


# ----------------------------------------------------------------------------------------- command lines


def format_value(value: Any) -> str:
  """A value as `--config.X.Y=` parses it back."""
  if isinstance(value, (list, tuple)):
    return repr(tuple(value))
  return str(value)


def command_line(cell: Cell, workdir: str, python: str = sys.executable) -> str:
  """One self-contained shell command that trains (or resumes) the cell in `workdir/<cell name>`."""
  args = [python, "-m", "experiments.tinystories", f"--config=configs/{cell.variant}.py:{cell.config_arg}",
          f"--workdir={os.path.join(os.path.abspath(workdir), cell.name)}"]
  args += [f"--config.{key}={format_value(value)}" for key, value in cell.overrides]
  return f"cd {shlex.quote(ROOT)} && " + " ".join(shlex.quote(a) for a in args)


def write_commands(cells: Sequence[Cell], workdir: str, python: str = sys.executable) -> tuple[str, int]:
  """Writes DIR/commands.txt, one line per cell that is not complete; returns (path, number of lines)."""
  pending = [c for c in cells if cell_status(os.path.join(workdir, c.name)).state != "complete"]
  path = os.path.join(workdir, "commands.txt")
  os.makedirs(workdir, exist_ok=True)
  write_text_atomically(path, "".join(command_line(c, workdir, python) + "\n" for c in pending))
  return path, len(pending)


# ------------------------------------------------------------------------------------------ device packing


def device_groups(devices: Sequence[Any], parallel: int) -> list[list[Any]]:
  """`parallel` disjoint device groups (0: one per device on accelerators, one group of all devices on CPU).

  On CPU more cells than devices may share one; on accelerators that is an error.
  """
  n = len(devices)
  platform = devices[0].platform if n else "cpu"
  if parallel < 0:
    raise SweepError(f"--parallel={parallel}: must be >= 0 (0 picks one cell per device, or one at a time on CPU)")
  if parallel == 0:
    parallel = 1 if platform == "cpu" else n
  if parallel == 1:
    return [list(devices)]
  if parallel <= n:
    size = n // parallel
    return [list(devices[i * size:(i + 1) * size]) for i in range(parallel)]
  if platform == "cpu":
    return [[devices[i % n]] for i in range(parallel)]
  raise SweepError(f"--parallel={parallel}: this host has {n} {platform} devices; at most one cell per device")


# --------------------------------------------------------------------------------------------------- output


class _ThreadRouter:
  """A stand-in for sys.stdout/sys.stderr that sends a worker thread's writes to that cell's log file."""

  def __init__(self, fallback: TextIO, targets: threading.local) -> None:
    self._fallback = fallback
    self._targets = targets

  def _stream(self) -> TextIO:
    return getattr(self._targets, "stream", None) or self._fallback

  def write(self, text: str) -> int:
    return self._stream().write(text)

  def flush(self) -> None:
    self._stream().flush()

  def isatty(self) -> bool:
    return self._stream().isatty()

  def __getattr__(self, name: str) -> Any:
    return getattr(self._stream(), name)


class _Routed:
  """Installs thread routers on sys.stdout/sys.stderr for the duration of a sweep."""

  def __init__(self) -> None:
    self.targets = threading.local()

  def __enter__(self) -> Self:
    self._saved = sys.stdout, sys.stderr
    sys.stdout = _ThreadRouter(sys.stdout, self.targets)
    sys.stderr = _ThreadRouter(sys.stderr, self.targets)
    return self

  def __exit__(self, *exc: object) -> None:
    sys.stdout, sys.stderr = self._saved


# -------------------------------------------------------------------------------------------------- progress


def cell_cost(cfg: ml_collections.ConfigDict) -> float:
  """Approximate training FLOPs of a cell (6·N + 12·L·D·T per token), to weigh cells in the ETA."""
  m = cfg.model
  params = m.V * m.D + 12 * m.L * m.D * m.D
  return float(cfg.train.steps * cfg.train.batch_size * m.T * (6 * params + 12 * m.L * m.D * m.T))


def duration(seconds: float) -> str:
  """`1h02m`, `4m05s`, `12s`."""
  seconds = round(seconds)
  if seconds >= 3600:
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
  if seconds >= 60:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds}s"


class Progress:
  """Counts cells by state and estimates the time left from the work (FLOP-weighted steps) done so far."""

  def __init__(self, cells: Sequence[Cell], workdir: str) -> None:
    self.workdir = workdir
    self.cells = {c.name: c for c in cells}
    configs = {c.name: c.config() for c in cells}
    self.steps = {name: cfg.train.steps for name, cfg in configs.items()}
    self.cost = {name: cell_cost(cfg) for name, cfg in configs.items()}
    self.state = {c.name: cell_status(os.path.join(workdir, c.name)).state for c in cells}
    self.t0 = time.time()
    self.done0 = self.work_done()

  def work_done(self) -> float:
    """Cost of complete cells plus the started share of the others."""
    total = 0.0
    for name, state in self.state.items():
      if state == "complete":
        total += self.cost[name]
      elif state in ("running", "incomplete", "failed"):
        frac = min(last_step(os.path.join(self.workdir, name)) / max(self.steps[name], 1), 1.0)
        total += self.cost[name] * frac
    return total

  def line(self) -> str:
    """`sweep: 4/15 complete, 1 running, 1 failed, 9 pending · 5m12s elapsed · ETA 14m05s · running: ...`."""
    counts = {s: sum(v == s for v in self.state.values()) for s in ("complete", "running", "failed")}
    waiting = len(self.state) - sum(counts.values())
    elapsed = time.time() - self.t0
    done = self.work_done()
    remaining = sum(self.cost[n] for n, s in self.state.items() if s not in ("complete", "failed")) - sum(
        self.cost[n] * min(last_step(os.path.join(self.workdir, n)) / max(self.steps[n], 1), 1.0)
        for n, s in self.state.items() if s in ("running", "incomplete"))
    rate = (done - self.done0) / elapsed if elapsed > 0 else 0.0
    eta = duration(max(remaining, 0.0) / rate) if rate > 0 else "—"
    running = [f"{n} (step {last_step(os.path.join(self.workdir, n))}/{self.steps[n]})"
               for n, s in self.state.items() if s == "running"]
    text = (f"sweep: {counts['complete']}/{len(self.state)} complete, {counts['running']} running, "
            f"{counts['failed']} failed, {waiting} to run · {duration(elapsed)} elapsed · ETA {eta}")
    return text + (" · running: " + ", ".join(running) if running else "")


# ---------------------------------------------------------------------------------------------------- runner


def run_cell(cell: Cell, workdir: str, devices: Sequence[Any], run_fn: RunFn,
             routed: _Routed | None = None) -> CellStatus:
  """Trains (or resumes) one cell on `devices`; any exception is recorded in its cell.json, never raised."""
  run_dir = os.path.join(workdir, cell.name)
  os.makedirs(run_dir, exist_ok=True)
  kind = getattr(devices[0], "device_kind", str(devices[0])) if devices else ""
  record = {**cell.to_json(), "status": "running", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "devices": [str(d) for d in devices], "device_kind": kind, "device_count": len(devices)}
  write_json_atomically(os.path.join(run_dir, CELL_RECORD), record)
  t0 = time.time()
  with open(os.path.join(run_dir, CELL_LOG), "a", buffering=1) as log:
    if routed is not None:
      routed.targets.stream = log
    try:
      results = run_fn(cell.config(), run_dir, devices=list(devices))
      record["status"] = "complete" if results.get("complete") else "incomplete"
    except Exception as e:  # noqa: BLE001 - one failing cell must not stop the sweep
      record.update(status="failed", error=f"{type(e).__name__}: {e}",
                    traceback=traceback.format_exc(limit=8)[-4000:])
      log.write(traceback.format_exc())
    finally:
      if routed is not None:
        routed.targets.stream = None
  record.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_time_s=time.time() - t0)
  write_json_atomically(os.path.join(run_dir, CELL_RECORD), record)
  return cell_status(run_dir)


def prepare_data(cells: Sequence[Cell]) -> None:
  """Prepares every corpus the cells read, once, before cells start in parallel."""
  from tapernorm_jax import data  # heavy import, only for real runs
  seen: set[str] = set()
  for cell in cells:
    data_cfg = cell.config().data
    key = data_cfg.to_json_best_effort(sort_keys=True)
    if key not in seen:
      seen.add(key)
      data.prepare(data_cfg)


def run(cells: Sequence[Cell], workdir: str, *, parallel: int = 0, devices: Sequence[Any] | None = None,
        run_fn: RunFn | None = None, retry_failed: bool = True, progress_every: float = 30.0,
        echo: Callable[[str], None] = print) -> dict[str, CellStatus]:
  """Runs every cell that is not complete, `parallel` at a time on disjoint device groups; returns each status.

  Complete cells are skipped, incomplete ones resume from their checkpoints, failed ones are retried
  (unless `retry_failed=False`). A failing cell is recorded in its cell.json and the others go on.
  Each cell's output goes to DIR/<cell>/log.txt; `echo` gets one progress line per event and every
  `progress_every` seconds.
  """
  workdir = os.path.abspath(os.path.expanduser(workdir))
  os.makedirs(workdir, exist_ok=True)
  groups = device_groups(list(devices) if devices is not None else jax.devices(), parallel)
  progress = Progress(cells, workdir)
  todo = [c for c in cells if progress.state[c.name] not in ("complete",) + (() if retry_failed else ("failed",))]
  if run_fn is None:
    from tapernorm_jax.train import loop  # keeps the grid tools importable without the trainer
    run_fn = loop.run
    if todo:
      prepare_data(todo)
  echo(f"sweep: {len(cells)} cells in {workdir}; {len(cells) - len(todo)} already done or skipped, "
       f"{len(todo)} to run, {len(groups)} at a time on {', '.join(str(len(g)) for g in groups)} device(s) each")
  tasks: queue.Queue[Cell] = queue.Queue()
  for cell in todo:
    tasks.put(cell)
  events: queue.Queue[tuple[str, Cell, Any]] = queue.Queue()

  def worker(group: list[Any]) -> None:
    """Runs cells from the queue on one device group until none are left."""
    while True:
      try:
        cell = tasks.get_nowait()
      except queue.Empty:
        return
      events.put(("start", cell, group))
      try:
        status = run_cell(cell, workdir, group, run_fn, routed)
      except Exception as e:  # noqa: BLE001 - e.g. the cell record could not be written; the sweep goes on
        status = CellStatus("failed", error=f"{type(e).__name__}: {e}")
      events.put(("end", cell, status))

  with _Routed() as routed:
    threads = [threading.Thread(target=worker, args=(g,), daemon=True) for g in groups[:max(len(todo), 1)]]
    for t in threads:
      t.start()
    finished = 0
    while finished < len(todo):
      try:
        kind, cell, payload = events.get(timeout=progress_every)
      except queue.Empty:
        echo(progress.line())
        continue
      if kind == "start":
        progress.state[cell.name] = "running"
        echo(f"{cell.name}: started on {', '.join(str(d) for d in payload)} (log: {cell.name}/{CELL_LOG})")
        continue
      status = payload
      finished += 1
      progress.state[cell.name] = status.state
      note = f" ({status.error})" if status.state == "failed" else ""
      echo(f"{cell.name}: {status.state}{note}")
      echo(progress.line())
    for t in threads:
      t.join()
  return {c.name: cell_status(os.path.join(workdir, c.name)) for c in cells}

