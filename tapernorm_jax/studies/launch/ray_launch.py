"""Cells as Ray tasks: `experiments.sweep --launch=ray` runs every pending cell of a study on a Ray cluster.

Each cell is one task, `train_cell`, that asks for one run's resources (`cell_request`) and calls `runner.run_cell`,
the code path every launch shares. A task whose node dies or whose worker is killed is retried (`max_retries`) and
resumes from the cell's last checkpoint; a cell that fails on its own is recorded in its cell.json, as the local
runner records it, and is not retried until the next launch. Ray is imported only here (the `cluster` extra).

    run(cells, workdir, address=…)    every cell that is not complete, as tasks; progress lines as the local runner's
"""

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tapernorm_jax.runtime import allocator
from tapernorm_jax.errors import UserError
from tapernorm_jax.storage.run_files import is_url, workdir_path
from tapernorm_jax.studies.spec import Cell, SweepError
from tapernorm_jax.studies.manifest import CellStatus, cell_status, find_cell, read_record, write_record
from tapernorm_jax.studies.launch.runner import CELL_LOG, Progress, Routed, run_cell, say, trainer_run_fn

Node = Mapping[str, Any]  # one entry of `ray.nodes()`: NodeID, NodeManagerAddress, Alive, Resources
NOT_ASKED = ("memory", "object_store_memory")  # what every node has and a cell does not ask for
PROBE = ".ray_probe"  # DIR/.ray_probe: written by the driver, read back by a task on every node


class RayMissingError(UserError, ImportError):
  """--launch=ray without Ray installed."""


def import_ray() -> Any:
  """The `ray` module, or a one-line error saying how to install it."""
  try:
    import ray
  except ImportError as e:
    raise RayMissingError(f"--launch=ray needs Ray ({e}); pip install 'tapernorm_jax[cluster]'") from None
  return ray


def parse_resources(text: str) -> dict[str, float]:
  """`--cell_resources='{"GPU": 1}'` → {"GPU": 1.0}; '' → {} (the cluster's default)."""
  if not text:
    return {}
  try:
    request = json.loads(text)
  except json.JSONDecodeError as e:
    raise SweepError(f"--cell_resources={text}: not JSON ({e.msg}); e.g. --cell_resources='{{\"GPU\": 1}}'") from None
  if (
    not isinstance(request, dict)
    or not request
    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in request.values())
  ):
    raise SweepError(
      f"--cell_resources={text}: give a JSON object of resource names to amounts >= 0, "
      "e.g. '{\"GPU\": 1}' or '{\"TPU\": 4}'"
    )
  return {str(k): float(v) for k, v in request.items()}


def cell_request(nodes: Sequence[Node], override: Mapping[str, float] | None = None) -> dict[str, float]:
  """What one cell asks of the cluster: `override`, else one GPU, else one TPU host's chips, else one node's CPUs
  (XLA:CPU uses every core it is given, so one cell per CPU node)."""
  alive = [node["Resources"] for node in nodes if node.get("Alive")]
  if override:
    request = dict(override)
  elif any(r.get("GPU") for r in alive):
    request = {"GPU": 1.0}
  elif any(r.get("TPU") for r in alive):
    request = {"TPU": min(r["TPU"] for r in alive if r.get("TPU"))}  # one cell per TPU host: all its chips
  else:
    request = {"CPU": min((r["CPU"] for r in alive if r.get("CPU")), default=1.0)}
  if not any(all(r.get(k, 0) >= v for k, v in request.items()) for r in alive):
    offered = "; ".join(
      show({k: v for k, v in r.items() if k not in NOT_ASKED and not k.startswith("node:")}) for r in alive
    )
    raise SweepError(
      f"--cell_resources={show(request)}: no node of the Ray cluster offers that (its nodes: "
      f"{offered or 'none alive'}); ask for what a node has, e.g. --cell_resources='{{\"CPU\": 1}}'"
    )
  return request


def show(resources: Mapping[str, float]) -> str:
  """`{"GPU": 1, "acc": 0.5}`, as the flag takes it."""
  return "{" + ", ".join(f'"{k}": {v:g}' for k, v in sorted(resources.items())) + "}"


def task_options(request: Mapping[str, float], max_retries: int) -> dict[str, Any]:
  """`.options(...)` for one cell's task: its resources, retried only when Ray loses the worker or its node."""
  custom = {k: v for k, v in request.items() if k not in ("CPU", "GPU")}
  return dict(
    num_cpus=request.get("CPU", 0),
    num_gpus=request.get("GPU", 0),
    resources=custom,
    max_retries=max_retries,
    retry_exceptions=False,
  )


def train_cell(study: str, name: str) -> CellStatus:
  """A Ray task: trains (or resumes) the cell `name` of the study in `study` on this worker's devices, its output
  in the cell's log.txt, as `python -m tapernorm_jax.studies.launch.cell` would (malloc set as `cli.run` sets it, which
  takes hold where this worker has not started jax yet)."""
  allocator.keep_freed_memory()
  import jax
  import ray

  cell = find_cell(study, name)
  where = {"ray_node": ray.get_runtime_context().get_node_id()}
  with Routed() as routed:  # the cell's progress bar and warnings go to DIR/<cell>/log.txt
    return run_cell(cell, study, jax.devices(), trainer_run_fn(), routed, where=where)


def _read_probe(path: str, token: str) -> str:
  """A Ray task: '' when this node reads `token` from `path`, else why not."""
  try:
    text = workdir_path(path).read_text()
  except Exception as e:  # noqa: BLE001 - a missing mount, filesystem or credential: reported by the driver
    return f"{type(e).__name__}: {e}"
  return "" if text == token else "another file is at that path"


def check_shared(ray: Any, workdir: str, nodes: Sequence[Node]) -> None:
  """A SweepError unless every alive node reads the file the driver writes into `workdir` (every cell writes its
  run there and the driver reads the cells' records back)."""
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

  token, path = uuid.uuid4().hex, os.path.join(workdir, PROBE)
  workdir_path(path).write_text(token)
  alive = [node for node in nodes if node.get("Alive")]
  probe = ray.remote(_read_probe)
  why_not = ray.get(
    [
      probe.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
        path, token
      )
      for node in alive
    ]
  )
  workdir_path(path).unlink()
  blind = [f"{node['NodeManagerAddress']} ({why[:120]})" for node, why in zip(alive, why_not) if why]
  if blind:
    raise SweepError(
      f"--workdir={workdir}: the Ray node(s) at {', '.join(blind)} cannot read it; give a directory "
      "every node mounts at the same path (NFS, a shared disk) or a gs:// URL every node can reach"
    )


def lost(run_dir: str, error: Exception) -> CellStatus:
  """Records in cell.json a cell whose task Ray gave up on (its node or worker lost more often than retried)."""
  record = read_record(run_dir)
  record.update(
    status="failed",
    error=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}",
    finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
  )
  write_record(run_dir, record)
  return cell_status(run_dir)


def _starts(pending: Mapping[Any, Cell], progress: Progress, workdir: str) -> list[str]:
  """A line for each pending cell whose task began since the last look (its cell.json says running)."""
  lines = []
  for cell in pending.values():
    record = read_record(os.path.join(workdir, cell.name))
    if record.get("status") == "running" and progress.state[cell.name] != "running":
      progress.state[cell.name] = "running"
      lines.append(
        f"{cell.name}: started on {record.get('host', '?')}, Ray node {record.get('ray_node', '?')[:8]} "
        f"(log: {cell.name}/{CELL_LOG})"
      )
  return lines


@contextlib.contextmanager
def ctrl_c_noted() -> Iterator[threading.Event]:
  """Within the block, Ctrl-C (SIGINT) only sets the event, for the caller to act on between waits: a
  KeyboardInterrupt raised inside Ray's waits can be lost (seen on a loaded machine), a noted signal cannot."""
  pressed = threading.Event()
  if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
    yield pressed
    return
  previous = signal.signal(signal.SIGINT, lambda *_: pressed.set())
  try:
    yield pressed
  finally:
    signal.signal(signal.SIGINT, previous)


def _follow(
  ray: Any,
  pending: dict[Any, Cell],
  progress: Progress,
  workdir: str,
  progress_every: float,
  echo: Callable[[str], None],
  pressed: threading.Event,
) -> None:
  """Waits for the tasks in `pending` (emptying it), echoing each cell's start and end and a progress line every
  `progress_every` seconds; a task Ray gave up on is recorded as failed. Raises KeyboardInterrupt within one look
  of `pressed` being set."""
  last_line = time.time()
  look_every = 10.0 if is_url(workdir) else 2.0  # each look reads every pending cell's cell.json: few, on a bucket
  while pending:
    if pressed.is_set():
      raise KeyboardInterrupt
    ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(progress_every, look_every))
    for line in _starts(pending, progress, workdir):
      echo(line)
    for ref in ready:
      cell = pending.pop(ref)
      try:
        status = ray.get(ref)
      except ray.exceptions.RayError as e:  # the node or worker was lost more often than retried
        status = lost(os.path.join(workdir, cell.name), e)
      progress.state[cell.name] = status.state
      echo(f"{cell.name}: {status.state}" + (f" ({status.error})" if status.state == "failed" else ""))
    if ready or time.time() - last_line >= progress_every:
      echo(progress.line())
      last_line = time.time()


def run(
  cells: Sequence[Cell],
  workdir: str,
  *,
  address: str = "",
  resources: Mapping[str, float] | None = None,
  max_retries: int = 3,
  retry_failed: bool = True,
  progress_every: float = 30.0,
  echo: Callable[[str], None] | None = None,
) -> dict[str, CellStatus]:
  """Runs every cell that is not complete as a Ray task on the cluster at `address` ('': Ray's own discovery, a
  local cluster when none is found); returns each cell's status. The study's DIR/sweep.json must hold the cells."""
  if max_retries < 0:
    raise SweepError(f"--max_retries={max_retries}: must be >= 0 (times a cell is retried after losing its node)")
  ray, echo = import_ray(), echo or say
  workdir = str(workdir_path(workdir))
  progress = Progress(cells, workdir)
  todo = progress.to_run(retry_failed)
  if not ray.is_initialized():
    ray.init(address=address or None, log_to_driver=False, configure_logging=False)
  nodes = ray.nodes()
  request = cell_request(nodes, resources)
  check_shared(ray, workdir, nodes)
  echo(progress.opening(todo, f"as Ray tasks of {show(request)} on {sum(n['Alive'] for n in nodes)} node(s)"))
  task = ray.remote(train_cell).options(**task_options(request, max_retries))
  pending = {task.remote(workdir, cell.name): cell for cell in todo}
  try:
    with ctrl_c_noted() as pressed:
      _follow(ray, pending, progress, workdir, progress_every, echo, pressed)
  except KeyboardInterrupt:
    for ref in pending:
      ray.cancel(ref, force=True)  # as Ray would when this driver exits; said here so the user sees it
    echo(
      f"stopped: {len(pending)} cells not finished ({', '.join(c.name for c in pending.values())}); run the "
      "same command again and they resume from their last checkpoints"
    )
    raise
  return {c.name: cell_status(os.path.join(workdir, c.name)) for c in cells}
