"""A lost process in a 2-process run (every parameter sharded across both, as on a pod): SIGKILL process 1 after a
checkpoint, and process 0 stops within `mesh.process_timeout_s` (+ a margin for a loaded machine) with exit code 1 and
one line naming process 1, its step and the checkpoint a relaunch resumes from, not at JAX's own heartbeat timeout
(100 s). Relaunched, both processes resume from that checkpoint and end with the uninterrupted run's losses, bit for
bit (train/processes.py)."""

import re
import signal
import subprocess
import sys
import time

import pytest

import kills
from configs import base
from locations import ROOT
from multihost import MESHES, finish, free_port, prepare_shared, read, results_of, start
from tapernorm_jax.train import run_config
from tapernorm_jax.train import processes

STEPS, EVERY, TIMEOUT_S = 12, 4, 5
MARGIN_S = 10  # detection takes TIMEOUT_S + one heartbeat interval (0.5 s); the rest is for 2 busy cores
CHANGES = {"train.steps": STEPS, "checkpoint.every": EVERY, "checkpoint.keep": 100, "mesh.process_timeout_s": TIMEOUT_S}
LINE = re.compile(
  r"error: process 1 was lost \(no heartbeat for 5 s, mesh\.process_timeout_s=5\) at step (\d+) of "
  r"process 0; (?:the last complete checkpoint is step (\d+) in \S+|no complete checkpoint in \S+ "
  r"\(a relaunch starts over\)); relaunch every process with the same command to resume"
)


@pytest.mark.slow  # three 2-process runs
def test_a_lost_process_stops_the_other_in_the_timeout_and_a_relaunch_resumes_bit_exact(tmp_path_factory, tmp_path):
  shared, mesh = prepare_shared(tmp_path_factory), MESHES["fsdp"]
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  finish(start(2, shared, reference, mesh, str(tmp_path / "record0"), changes=CHANGES))
  run = start(2, shared, killed, mesh, str(tmp_path / "record1"), changes=CHANGES)
  reached = lambda: kills.last_step(killed) >= EVERY + 2  # past the first checkpoint, mid-run
  history = [kills.kill_when(run.procs[1], reached, f"step {EVERY + 2} (process 1 only)")]
  killed_at = time.time()
  survivor = run.procs[0]
  try:
    survivor.wait(timeout=TIMEOUT_S + MARGIN_S)
  except Exception:  # noqa: BLE001 (reported below with its output)
    survivor.kill()
    survivor.wait()
  stopped_s = time.time() - killed_at
  stderr = read(run.logs[0][1])
  assert history[0].startswith("killed"), history
  assert stopped_s < TIMEOUT_S + MARGIN_S and survivor.returncode == 1, (stopped_s, survivor.returncode, stderr[-3000:])
  lines = [line for line in stderr.splitlines() if "was lost" in line]
  assert len(lines) == 1 and (match := LINE.fullmatch(lines[0])), stderr[-3000:]
  assert int(match[1]) >= EVERY + 1  # the step process 0 was at (the kill came after step EVERY + 1 was logged)
  kills.check_whole(killed)
  finish(start(2, shared, killed, mesh, str(tmp_path / "record2"), changes=CHANGES))
  assert results_of(killed)["resumed_from"] == int(match[2] or 0)  # the checkpoint the line named
  kills.check_whole(killed)
  kills.check_same_ending(reference, killed, STEPS, history)


# Two processes that join, note a step and block for good (a collective that never returns, as on a TPU pod).
BLOCKED = """
import sys, time
import jax
jax.config.update("jax_platforms", "cpu")
from etils import epath
from configs import base
from tapernorm_jax.train import processes
port, index, checkpoints = sys.argv[1:]
cfg = base.override(base.get_config("all_taper"), {"mesh.distributed": True, "mesh.num_processes": 2,
    "mesh.coordinator_address": f"localhost:{port}", "mesh.process_id": int(index), "mesh.process_timeout_s": 2})
processes.initialize(cfg.mesh)
processes.at_step(7, epath.Path(checkpoints))
print("blocked", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("lost", [1, 0])
def test_a_process_blocked_for_good_is_stopped_when_the_other_is_lost(tmp_path, lost):
  """Process 1 lost: process 0's watchdog (2 s) ends it with the line; process 0 lost (the coordination service with
  it): JAX's client aborts process 1 at once, before the watchdog (its line is JAX's)."""
  checkpoints = tmp_path / "checkpoints"
  for name in ("3", "6", "9.orbax-checkpoint-tmp-1"):  # 9: a save in flight, not complete
    (checkpoints / name).mkdir(parents=True)
  port, logs = free_port(), [tmp_path / f"stderr{i}" for i in range(2)]
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", BLOCKED, str(port), str(i), str(checkpoints)],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=open(logs[i], "w"),
      text=True,
    )
    for i in range(2)
  ]
  try:
    assert [p.stdout.readline() for p in procs] == ["blocked\n"] * 2, [log.read_text() for log in logs]
    procs[lost].send_signal(signal.SIGKILL)
    killed_at, survivor = time.time(), procs[1 - lost]
    survivor.wait(timeout=2 + 10)
    stopped_s, stderr = time.time() - killed_at, logs[1 - lost].read_text()
  finally:
    for p in procs:
      p.kill()
      p.wait()
  if lost == 1:
    assert survivor.returncode == processes.EXIT_LOST and 2 <= stopped_s < 2 + 10, (stopped_s, stderr[-3000:])
    assert (
      f"\nerror: process 1 was lost (no heartbeat for 2 s, mesh.process_timeout_s=2) at step 7 of process 0; the "
      f"last complete checkpoint is step 6 in {checkpoints}; relaunch every process with the same command to "
      "resume\n"
    ) in stderr
  else:
    assert survivor.returncode == -signal.SIGABRT and stopped_s < 2, (stopped_s, stderr[-3000:])
    assert "Terminating process because the JAX distributed service detected fatal errors" in stderr


@pytest.mark.parametrize("value", [0.0, 0.5, -1.0, float("nan"), float("inf")])
def test_a_bad_process_timeout_is_one_line_naming_the_field_before_anything_runs(value):
  cfg = base.override(base.get_config("all_taper"), {"mesh.distributed": True})
  cfg.mesh.process_timeout_s = value
  expected = f"mesh.process_timeout_s={value!r}: must be a finite number of seconds >= 1"
  for check in (lambda: run_config.validate(cfg, 1), lambda: processes.initialize(cfg.mesh)):
    with pytest.raises(ValueError, match=re.escape(expected)):
      check()


def test_one_process_starts_no_watchdog():
  assert processes.start(processes.DEFAULT_TIMEOUT_S) is None and processes._watchdog is None
  assert not [t for t in __import__("threading").enumerate() if t.name == "tapernorm-processes"]
  processes.at_step(3, None)  # nothing to note
  processes.settle()  # returns at once


class SlowStore:
  """A key-value store whose calls take a while, as the coordination service's C++ client may; counts calls."""

  def __init__(self):
    self.calls, self.values = 0, {}

  def key_value_set(self, key, value, allow_overwrite):
    self.calls += 1
    time.sleep(0.05)
    self.values[key] = value

  def key_value_dir_get(self, prefix):
    time.sleep(0.05)
    return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


def test_closing_the_watchdog_stops_its_thread_outside_the_store_before_the_interpreter_exits():
  store = SlowStore()
  watchdog = processes.Watchdog(store, 0, 2, timeout_s=5)  # beats every 0.5 s
  watchdog.thread.start()
  time.sleep(1.3)
  t0 = time.monotonic()
  watchdog.close()
  # joined: no store call in flight when Python finalizes (a daemon thread inside the C++ client then aborts it)
  assert not watchdog.thread.is_alive() and watchdog.exiting and time.monotonic() - t0 < watchdog.interval + 1
  calls = store.calls
  time.sleep(3 * watchdog.interval)
  assert store.calls == calls >= 2  # it beat while running, and never after
