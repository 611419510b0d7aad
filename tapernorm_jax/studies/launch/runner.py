"""The in-process runner: cells packed onto disjoint device groups, each cell's output routed to its own log, one
failing cell recorded and the others going on, complete cells skipped and incomplete ones resumed, and progress
lines with an ETA.

    run(cells, workdir)         every cell of a sweep that is not complete, `parallel` at a time
    run_cell(cell, workdir, …)  one cell, its cell.json record written before and after; `studies.cell` runs it
"""

import contextlib
import os
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Self, TextIO

import jax
import ml_collections

from tapernorm_jax.storage import run_files
from tapernorm_jax.runtime import costs
from tapernorm_jax.studies.launch import grid
from tapernorm_jax.studies.spec import Cell, SweepError
from tapernorm_jax.studies.manifest import CellStatus, cell_status, last_step, write_record

CELL_LOG = "log.txt"  # DIR/<cell>/log.txt: the cell's own output (its progress bar, warnings)
RunFn = Callable[..., dict]  # loop.run's signature: (cfg, workdir, *, devices) -> results
Event = tuple[str, Cell, Any]  # ("start", cell, device group) or ("end", cell, CellStatus)


def device_groups(devices: Sequence[Any], parallel: int, oversubscribe: bool = False) -> list[list[Any]]:
  """`parallel` disjoint device groups (0: one per device on accelerators, one group of all devices on CPU).

  More cells than devices is an error, unless `oversubscribe` on CPU: then cells share devices (and cores).
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
    return [list(devices[i * size : (i + 1) * size]) for i in range(parallel)]
  if platform == "cpu" and oversubscribe:
    return [[devices[i % n]] for i in range(parallel)]
  if platform == "cpu":
    raise SweepError(
      f"--parallel={parallel}: this host has {n} CPU device(s), so cells would share them and their "
      f"cores, each running slower than alone (on a few cores, slower in all than one after another); "
      f"use --parallel={n} or less, or add --oversubscribe to share them anyway"
    )
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


class Routed:
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
  params = m.V * m.D + 12 * m.L * m.D * m.D  # embeddings and the blocks' matrices, without building the model
  return cfg.train.steps * cfg.train.batch_size * m.T * costs.train_flops_per_token(params, m.L, m.D, m.T)


def say(line: str) -> None:
  """Prints a progress line at once (also when stdout is a file: a study's log is read while it runs)."""
  print(line, flush=True)


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
    configs = {c.name: grid.cell_config(c) for c in cells}
    self.steps = {name: cfg.train.steps for name, cfg in configs.items()}
    self.cost = {name: cell_cost(cfg) for name, cfg in configs.items()}
    self.state = {c.name: cell_status(os.path.join(workdir, c.name)).state for c in cells}
    self.t0 = time.time()
    self.done0 = self.work_done()

  def to_run(self, retry_failed: bool) -> list[Cell]:
    """The cells a launch runs: all but the complete ones (and the failed ones unless `retry_failed`)."""
    skip = ("complete",) + (() if retry_failed else ("failed",))
    return [cell for name, cell in self.cells.items() if self.state[name] not in skip]

  def opening(self, todo: Sequence[Cell], how: str) -> str:
    """`sweep: 15 cells in DIR; 3 already done or skipped, 12 to run, <how>`."""
    return (
      f"sweep: {len(self.cells)} cells in {self.workdir}; {len(self.cells) - len(todo)} already done or "
      f"skipped, {len(todo)} to run, {how}"
    )

  def started_share(self, name: str) -> float:
    """The share of a cell's steps that its metrics.jsonl records."""
    return min(last_step(os.path.join(self.workdir, name)) / max(self.steps[name], 1), 1.0)

  def work_done(self) -> float:
    """Cost of complete cells plus the started share of the others."""
    total = 0.0
    for name, state in self.state.items():
      if state == "complete":
        total += self.cost[name]
      elif state in ("running", "incomplete", "failed"):
        total += self.cost[name] * self.started_share(name)
    return total

  def line(self) -> str:
    """`sweep: 4/15 complete, 1 running, 1 failed, 9 pending · 5m12s elapsed · ETA 14m05s · running: ...`."""
    counts = {s: sum(v == s for v in self.state.values()) for s in ("complete", "running", "failed")}
    waiting = len(self.state) - sum(counts.values())
    elapsed = time.time() - self.t0
    done = self.work_done()
    remaining = sum(self.cost[n] for n, s in self.state.items() if s not in ("complete", "failed")) - sum(
      self.cost[n] * self.started_share(n) for n, s in self.state.items() if s in ("running", "incomplete")
    )
    rate = (done - self.done0) / elapsed if elapsed > 0 else 0.0
    eta = duration(max(remaining, 0.0) / rate) if rate > 0 else "—"
    running = [
      f"{n} (step {last_step(os.path.join(self.workdir, n))}/{self.steps[n]})"
      for n, s in self.state.items()
      if s == "running"
    ]
    text = (
      f"sweep: {counts['complete']}/{len(self.state)} complete, {counts['running']} running, "
      f"{counts['failed']} failed, {waiting} to run · {duration(elapsed)} elapsed · ETA {eta}"
    )
    return text + (" · running: " + ", ".join(running) if running else "")


# ---------------------------------------------------------------------------------------------------- runner


@contextlib.contextmanager
def cell_log(run_dir: str) -> Iterator[TextIO]:
  """DIR/<cell>/log.txt opened to append: on a local disk directly; at a URL, whose objects cannot be appended to, a
  local copy uploaded when the cell ends."""
  if not run_files.is_url(run_dir):
    with open(os.path.join(run_dir, CELL_LOG), "a", buffering=1) as log:
      yield log
    return
  mirror = run_files.Mirror(run_files.workdir_path(run_dir))
  mirror.download(CELL_LOG)
  try:
    with open(mirror.local / CELL_LOG, "a", buffering=1) as log:
      yield log
  finally:
    mirror.close()


def study_config(cell: Cell, workdir: str) -> ml_collections.ConfigDict:
  """The cell's config as the study trains it: its tracker runs grouped under the study directory's name."""
  cfg = grid.cell_config(cell)
  if not cfg.tracking.wandb_group:
    cfg.tracking.wandb_group = os.path.basename(os.path.normpath(str(workdir)))
  return cfg


def run_cell(
  cell: Cell,
  workdir: str,
  devices: Sequence[Any],
  run_fn: RunFn,
  routed: Routed | None = None,
  *,
  reraise: bool = False,
  where: Mapping[str, str] | None = None,
) -> CellStatus:
  """Trains (or resumes) one cell on `devices`; any exception is recorded in its cell.json (with the host and
  `where` it ran), and raised again only with `reraise` (one cell on its own, whose caller reports the error)."""
  run_dir = os.path.join(workdir, cell.name)
  run_files.workdir_path(run_dir).mkdir(parents=True, exist_ok=True)
  kind = getattr(devices[0], "device_kind", str(devices[0])) if devices else ""
  record = {
    **cell.to_json(),
    "status": "running",
    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "host": socket.gethostname(),
    **(where or {}),
    "devices": [str(d) for d in devices],
    "device_kind": kind,
    "device_count": len(devices),
  }
  write_record(run_dir, record)
  t0, error = time.time(), None
  with cell_log(run_dir) as log:
    if routed is not None:
      routed.targets.stream = log
    try:
      results = run_fn(study_config(cell, workdir), run_dir, devices=list(devices))
      record["status"] = "complete" if results.get("complete") else "incomplete"
    except Exception as e:  # noqa: BLE001 - one failing cell must not stop the sweep
      error = e
      record.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8)[-4000:])
      log.write(traceback.format_exc())
    finally:
      if routed is not None:
        routed.targets.stream = None
  record.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_time_s=time.time() - t0)
  write_record(run_dir, record)
  if reraise and error is not None:
    raise error
  return cell_status(run_dir)


def prepare_data(cells: Sequence[Cell]) -> None:
  """Prepares every corpus the cells read, once, before cells start in parallel."""
  from tapernorm_jax import data  # heavy import, only for real runs

  seen: set[str] = set()
  for cell in cells:
    data_cfg = grid.cell_config(cell).data
    key = data_cfg.to_json_best_effort(sort_keys=True)
    if key not in seen:
      seen.add(key)
      data.prepare(data_cfg)


def trainer_run_fn() -> RunFn:
  """`loop.run`, imported only when cells really train (the grid tools stay importable without the trainer)."""
  from tapernorm_jax.train import loop

  return loop.run


def _work(
  tasks: queue.Queue[Cell], events: queue.Queue[Event], group: list[Any], workdir: str, run_fn: RunFn, routed: Routed
) -> None:
  """A worker thread: runs cells from `tasks` on one device group until none are left, reporting to `events`."""
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


def _follow(
  events: queue.Queue[Event], count: int, progress: Progress, echo: Callable[[str], None], progress_every: float
) -> None:
  """Echoes each cell's start and end and a progress line every `progress_every` seconds until `count` cells end."""
  finished = 0
  while finished < count:
    try:
      kind, cell, payload = events.get(timeout=progress_every)
    except queue.Empty:
      echo(progress.line())
      continue
    if kind == "start":
      progress.state[cell.name] = "running"
      echo(f"{cell.name}: started on {', '.join(str(d) for d in payload)} (log: {cell.name}/{CELL_LOG})")
      continue
    finished += 1
    progress.state[cell.name] = payload.state
    note = f" ({payload.error})" if payload.state == "failed" else ""
    echo(f"{cell.name}: {payload.state}{note}")
    echo(progress.line())


def run(
  cells: Sequence[Cell],
  workdir: str,
  *,
  parallel: int = 0,
  oversubscribe: bool = False,
  devices: Sequence[Any] | None = None,
  run_fn: RunFn | None = None,
  retry_failed: bool = True,
  progress_every: float = 30.0,
  echo: Callable[[str], None] | None = None,
) -> dict[str, CellStatus]:
  """Runs every cell that is not complete, `parallel` at a time on disjoint device groups; returns each status.

  Complete cells are skipped, incomplete ones resume from their checkpoints, failed ones are retried
  (unless `retry_failed=False`). A failing cell is recorded in its cell.json and the others go on.
  Each cell's output goes to DIR/<cell>/log.txt; `echo` gets one progress line per event and every
  `progress_every` seconds.
  """
  workdir = str(run_files.workdir_path(workdir))
  run_files.workdir_path(workdir).mkdir(parents=True, exist_ok=True)
  echo = echo or say
  groups = device_groups(list(devices) if devices is not None else jax.devices(), parallel, oversubscribe)
  progress = Progress(cells, workdir)
  todo = progress.to_run(retry_failed)
  if run_fn is None:
    run_fn = trainer_run_fn()
    if todo:
      prepare_data(todo)
  echo(progress.opening(todo, f"{len(groups)} at a time on {', '.join(str(len(g)) for g in groups)} device(s) each"))
  tasks: queue.Queue[Cell] = queue.Queue()
  for cell in todo:
    tasks.put(cell)
  events: queue.Queue[Event] = queue.Queue()
  with Routed() as routed:
    threads = [
      threading.Thread(target=_work, args=(tasks, events, g, workdir, run_fn, routed), daemon=True)
      for g in groups[: max(len(todo), 1)]
    ]
    for t in threads:
      t.start()
    _follow(events, len(todo), progress, echo, progress_every)
    for t in threads:
      t.join()
  return {c.name: cell_status(os.path.join(workdir, c.name)) for c in cells}
