"""One process per run or study directory: a second is refused by name, a killed holder's lock is free at once, and
the staging files of writers that are gone are removed when the next one starts."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from etils import epath

from tapernorm_jax.storage import directory_lock
from locations import ROOT

HOLDER = textwrap.dedent("""
    import sys, time
    from tapernorm_jax.storage import directory_lock, run_files
    with directory_lock.hold(sys.argv[1], "--workdir"):
      with open(run_files.staging_path(sys.argv[1] + "/metrics.jsonl"), "w") as f:  # a write it never finishes
        f.write("half")
      print("held", flush=True)
      time.sleep(600)
""")


def start_holder(directory: str) -> subprocess.Popen:
  """A process that holds `directory` and leaves a staging file in it, until it is killed."""
  process = subprocess.Popen([sys.executable, "-c", HOLDER, directory], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  assert process.stdout.readline().strip() == "held"
  return process


def test_a_held_directory_is_refused_by_name_and_a_killed_holders_leftovers_go_at_the_next_start(tmp_path):
  run = str(tmp_path / "run")
  holder = start_holder(run)
  cell = str(tmp_path / "run" / "cell")  # a subdirectory with a live holder of its own is not touched
  cell_holder = start_holder(cell)
  try:
    with pytest.raises(directory_lock.DirectoryInUseError) as refused:
      with directory_lock.hold(run, "--workdir"):
        pass
    assert str(refused.value).startswith(
      f"--workdir={run} is in use by another process (pid {holder.pid} on host {socket.gethostname()}, since "
    )
    assert "\n" not in str(refused.value)
    os.kill(holder.pid, signal.SIGKILL)  # the kernel releases its lock: no waiting, no guessing from its pid
    holder.wait()
    leftover = f"{run}/metrics.jsonl.tmp-{holder.pid}"
    assert os.path.exists(leftover)
    with directory_lock.hold(run, "--workdir") as removed:
      assert removed == [leftover] and not os.path.exists(leftover)
      assert os.path.exists(f"{cell}/metrics.jsonl.tmp-{cell_holder.pid}")
  finally:
    for process in (holder, cell_holder):
      process.kill()
      process.wait()


def test_a_tinystories_run_in_a_held_directory_is_refused_in_one_line_before_it_trains(tmp_path):
  run = str(tmp_path / "run")
  holder = start_holder(run)
  try:
    done = subprocess.run(
      [
        sys.executable,
        "-m",
        "experiments.tinystories",
        "--config=configs/all_taper.py",
        f"--workdir={run}",
        "--config.train.steps=40",
        "--config.model.L=1",
        "--config.model.D=16",
        "--config.model.H=2",
        "--config.model.T=16",
        "--config.model.V=256",
        "--config.train.cpu_paths=xla",
        "--config.data.synthetic_train_stories=50",
        f"--config.data.data_dir={tmp_path / 'data'}",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
    )
  finally:
    holder.kill()
    holder.wait()
  assert done.returncode != 0
  errors = [line for line in done.stderr.splitlines() if "in use by another process" in line]
  assert len(errors) == 1 and f"pid {holder.pid}" in errors[0], done.stderr[-2000:]
  assert "Traceback" not in done.stderr and not os.path.exists(os.path.join(run, "checkpoints"))


def lease(directory: epath.Path, **record) -> None:
  (directory / directory_lock.LOCK_FILE).write_text(json.dumps(record))


def test_a_lease_at_a_url_is_taken_only_from_holders_that_are_gone(tmp_path):
  directory = epath.Path(tmp_path)
  here = socket.gethostname()
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  cases = {  # (holder's record, whether it is taken)
    "another host, renewed now": ({"host": "elsewhere", "pid": 1, "renewed": time.time()}, False),
    "another host, expired": (
      {"host": "elsewhere", "pid": 1, "renewed": time.time() - directory_lock.EXPIRE_S - 1},
      True,
    ),
    "this host, process alive": ({"host": here, "pid": os.getppid(), "renewed": 0.0}, False),
    "this host, process gone": ({"host": here, "pid": int(dead.stdout), "renewed": time.time()}, True),
  }
  for case, (record, taken) in cases.items():
    lease(directory, **record)
    held = directory_lock.RemoteLease(directory, "--workdir")
    if taken:
      held.acquire()
      assert json.loads((directory / ".lock").read_text())["pid"] == os.getpid(), case
      held.release()
      assert not (directory / ".lock").exists(), case
    else:
      with pytest.raises(directory_lock.DirectoryInUseError, match=f"pid {record['pid']} on host"):
        held.acquire()
