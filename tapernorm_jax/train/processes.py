"""A lost process in a multi-process run stops the others within `mesh.process_timeout_s` seconds, with one line that
names it, the step and the checkpoint a relaunch resumes from.

    initialize(mesh)   jax.distributed.initialize (with mesh.distributed), then this process's watchdog (`start`)
    at_step(k, dir)    the step this process is at and its checkpoint directory, for that line (loop.train_steps)
    settle()           after an error in the main thread: returns if every other process is alive, else never

The watchdog is one daemon thread per process. Every `interval` seconds it bumps this process's counter under
`tapernorm/heartbeat/<process>` in the key-value store of JAX's coordination service (hosted by process 0) and reads
everyone's. A process whose counter has not moved for `mesh.process_timeout_s` seconds (or, seen from the others, a
process 0 whose store no longer answers) is lost: the watchdog writes the line on stderr and ends this process with
exit code 1 (`os._exit`: a collective waiting for the lost process may never return, and JAX's own shutdown would
wait for it). The thread beats whatever the main thread does (compiling, blocked in a collective, saving a
checkpoint), so a slow step is never taken for a lost process.

Without it, a survivor waits for JAX's own heartbeat timeout (`jax.distributed.initialize`'s
heartbeat_timeout_seconds, 100 s by default; measured: 94 s after the other process was killed, on CPU), then aborts
(SIGABRT) with a coordination-service error that names neither the step nor the checkpoint. That timeout is set above
ours (`jax_heartbeat_timeout_s`), so the watchdog speaks first. A lost process 0 takes the coordination service
with it: JAX's client then aborts the others at once (measured: 0.15 s), with its own message ("the leader task was
preempted/died"), before the watchdog could name the step; the hook that would replace that abort
(`missed_heartbeat_callback`) is not offered by jax.distributed.initialize, and fails (std::bad_cast) when passed to
the client directly in jaxlib 0.10.2. One process: no thread, nothing to do.
"""

import atexit
import math
import os
import re
import threading
import time
from typing import Any

import jax
import ml_collections
from etils import epath

from tapernorm_jax.model import sharding

PREFIX = "tapernorm/heartbeat/"
DEFAULT_TIMEOUT_S = 60.0
EXIT_LOST = 1  # the run stopped (cli/failures.py's EXIT_STOPPED)

_watchdog: "Watchdog | None" = None


def check_timeout(value: Any) -> None:
  """Raises ValueError naming `mesh.process_timeout_s` unless it is a finite number of seconds >= 1."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value < math.inf:
    raise ValueError(
      f"mesh.process_timeout_s={value!r}: must be a finite number of seconds >= 1 (how long a silent "
      f"process may go unheard before the others stop; default {DEFAULT_TIMEOUT_S:g})"
    )


def jax_heartbeat_timeout_s(timeout_s: float) -> int:
  """JAX's own heartbeat timeout: its default (100 s), or longer, so that a lost process is named by the watchdog."""
  return max(100, int(2 * timeout_s))


def last_checkpoint(directory: epath.Path | None) -> str:
  """Where a relaunch resumes: the newest finalized step directory under `directory`, in words."""
  if directory is None:
    return "no checkpoint directory yet (a relaunch starts over)"
  try:
    from orbax.checkpoint import step as ocp_step  # a path check, no collective

    steps = [int(p.name) for p in directory.iterdir() if re.fullmatch(r"\d+", p.name) and ocp_step.is_path_finalized(p)]
  except Exception:  # noqa: BLE001 (no directory yet, or an unreadable one: the line says so)
    steps = []
  if not steps:
    return f"no complete checkpoint in {directory} (a relaunch starts over)"
  return f"the last complete checkpoint is step {max(steps)} in {directory}"


class Watchdog:
  """This process's heartbeat in the coordination service's key-value store, and its watch on the others'."""

  def __init__(self, client: Any, index: int, count: int, timeout_s: float):
    self.client, self.index, self.timeout_s = client, index, float(timeout_s)
    self.interval = min(max(self.timeout_s / 10, 0.2), 2.0)
    now = time.monotonic()
    self.seen = {p: ("", now) for p in range(count) if p != index}  # another process's counter and when it last moved
    self.answered = now  # when the store last answered
    self.stopping = threading.Event()  # set at exit (`close`), before JAX's shutdown closes the client
    self.beats = 0
    self.step: int | None = None
    self.checkpoints: epath.Path | None = None
    self.thread = threading.Thread(target=self.run, name="tapernorm-processes", daemon=True)

  @property
  def exiting(self) -> bool:
    """Whether this process is exiting (`close` was called)."""
    return self.stopping.is_set()

  def run(self) -> None:
    """Beats, reads the others' beats and stops this process once one is lost; until `close` (a daemon thread)."""
    while not self.stopping.is_set():
      self.beat()
      lost, why = self.lost()
      if lost:
        self.stop(lost, why)
      self.stopping.wait(self.interval)

  def close(self, timeout_s: float = 10.0) -> None:
    """Stops the thread and waits for it (at most `timeout_s`), so that the interpreter's exit never finds it inside
    the store's C++ client: a daemon thread still there when Python finalizes is ended by a forced unwind, which the
    client's catch-all handlers swallow, and the process aborts ("FATAL: exception not rethrown")."""
    self.stopping.set()
    if self.thread.is_alive() and self.thread is not threading.current_thread():
      self.thread.join(timeout_s)

  def beat(self) -> None:
    """Bumps this process's counter and notes every other counter that moved."""
    self.beats += 1
    try:
      self.client.key_value_set(f"{PREFIX}{self.index}", str(self.beats), allow_overwrite=True)
      values = dict(self.client.key_value_dir_get(PREFIX))
    except Exception:  # noqa: BLE001 (the store, in process 0, does not answer: judged in `lost`)
      return
    now = self.answered = time.monotonic()
    for p, (value, _) in self.seen.items():
      if values.get(f"{PREFIX}{p}", value) != value:
        self.seen[p] = (values[f"{PREFIX}{p}"], now)

  def lost(self) -> tuple[list[int], str]:
    """The processes unheard for longer than the timeout, and why: process 0 when its store stopped answering (not
    while this process exits: JAX's shutdown closes the client), else those whose counter stopped."""
    now = time.monotonic()
    if now - self.answered > self.timeout_s:
      return ([], "") if self.exiting else ([0], "its coordination service stopped answering")
    return [
      p for p, (_, moved) in self.seen.items() if now - moved > self.timeout_s
    ], f"no heartbeat for {self.timeout_s:g} s"

  def heard_since(self, t: float) -> bool:
    """Whether every other process beat after monotonic time `t` (a counter read a full interval later was written
    after `t`)."""
    return all(moved > t + 2 * self.interval for _, moved in self.seen.values())

  def stop(self, lost: list[int], why: str) -> None:
    """Writes the line naming the lost processes, why, the step and the checkpoint, and ends this process."""
    who = f"process {lost[0]} was" if len(lost) == 1 else f"processes {', '.join(map(str, lost))} were"
    step = "before the first step" if self.step is None else f"at step {self.step}"
    line = (
      f"\nerror: {who} lost ({why}, mesh.process_timeout_s={self.timeout_s:g}) {step} of process {self.index}; "
      f"{last_checkpoint(self.checkpoints)}; relaunch every process with the same command to resume\n"
    )
    os.write(2, line.encode())  # not sys.stderr: the main thread may hold its lock, blocked for good
    os._exit(EXIT_LOST)


def start(timeout_s: float) -> Watchdog | None:
  """Starts this process's watchdog once jax.distributed is initialized; None (and no thread) with one process."""
  global _watchdog
  from jax._src import distributed  # the client jax.distributed.initialize made: jax has no public accessor

  state = distributed.global_state
  if _watchdog is None and state.client is not None and (state.num_processes or 1) > 1:
    _watchdog = Watchdog(state.client, state.process_id, state.num_processes, timeout_s)
    _watchdog.thread.start()
    atexit.register(_watchdog.close)  # runs before JAX's shutdown, which registered earlier
  return _watchdog


def at_step(step: int, checkpoints: epath.Path) -> None:
  """Notes the step this process is at and its checkpoint directory, for the line naming a lost process."""
  if _watchdog is not None:
    _watchdog.step, _watchdog.checkpoints = step, checkpoints


def settle() -> None:
  """After an error in the main thread (a collective that failed as another process died): returns once every other
  process has beaten since, so the error is this process's own; else the watchdog ends this process, naming the lost
  one. Returns at once with one process."""
  watchdog = _watchdog
  if watchdog is None:
    return
  t = time.monotonic()
  deadline = t + watchdog.timeout_s + 4 * watchdog.interval  # the watchdog acts by then (a bound all the same)
  while time.monotonic() < deadline and not watchdog.heard_since(t):
    time.sleep(watchdog.interval / 4)


def initialize(mesh_cfg: ml_collections.ConfigDict) -> None:
  """`jax.distributed.initialize` with `sharding.distributed_options(mesh_cfg)` when `mesh.distributed` is set, then
  this process's watchdog (`start`)."""
  options = sharding.distributed_options(mesh_cfg)
  if options is not None:
    timeout_s = mesh_cfg.get("process_timeout_s", DEFAULT_TIMEOUT_S)
    check_timeout(timeout_s)
    jax.distributed.initialize(**options, heartbeat_timeout_seconds=jax_heartbeat_timeout_s(timeout_s))
    start(timeout_s)
