"""Fault injection: a training run killed with SIGKILL at seeded points across its life (during a step, during a
checkpoint save, at startup), and started again after each kill with the same command, ends exactly as the
uninterrupted run does, with no half-written file anywhere. TAPERNORM_FAULT_SEED picks other points (a failure names
its seed and points, so it reproduces)."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from etils import epath

from tapernorm_jax import integrity
from tapernorm_jax.train.metrics import read_jsonl
from locations import ROOT

SEED = int(os.environ.get("TAPERNORM_FAULT_SEED", "0"))
STEPS, EVERY = 48, 6
TINY = {"model.D": 32, "model.H": 4, "model.L": 2, "model.T": 32, "model.V": 512, "train.steps": STEPS,
        "train.batch_size": 8, "train.log_every": 4, "train.diag_every": 8, "train.eval_batches": 2,
        "checkpoint.every": EVERY, "checkpoint.keep": 100, "taper.gate_warmup_frac": 0.25, "taper.taper_end": 36,
        "opt.lr": 1e-3, "data.synthetic_train_stories": 400, "data.synthetic_valid_stories": 60}


def command(workdir: str, data_dir: str) -> list[str]:
  """The one command line the user runs, and runs again after every kill."""
  flags = [f"--config.{k}={v}" for k, v in {**TINY, "data.data_dir": data_dir}.items()]
  return [sys.executable, "-m", "experiments.tinystories", "--config=configs/all_taper.py", f"--workdir={workdir}",
          *flags]


def progress(workdir: str) -> tuple[int, bool]:
  """(the last step in metrics.jsonl + 1, whether a checkpoint save is in flight: Orbax's temporary directory)."""
  step = 0
  path = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          step = max(step, json.loads(line)["step"] + 1)
        except (ValueError, KeyError):  # the line being written
          pass
  checkpoints = os.path.join(workdir, "checkpoints")
  saving = os.path.isdir(checkpoints) and any("tmp" in name for name in os.listdir(checkpoints))
  return step, saving


def kill_at(proc: subprocess.Popen, workdir: str, kind: str, step: int) -> str:
  """SIGKILLs `proc` once it reaches `step` (kind 'step'), or once a save after `step` is in flight (kind 'save';
  if none is seen within one checkpoint interval, after it); returns what happened."""
  deadline = time.time() + 300
  while time.time() < deadline:
    if proc.poll() is not None:
      return f"finished before {kind} {step}"
    reached, saving = progress(workdir)
    if (kind == "step" and reached >= step) or (kind == "save" and reached >= step and saving) or (
        kind == "save" and reached >= step + EVERY):
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      return f"killed at {kind} {step} (metrics at step {reached}, save in flight: {saving})"
    time.sleep(0.002)
  proc.kill()
  raise AssertionError(f"seed {SEED}: the run did not reach {kind} {step} in 300 s")


def check_whole(workdir: str) -> None:
  """No half-written file: every JSON parses, metrics.jsonl has each step once and in order from 0, and every
  complete checkpoint matches its manifest."""
  for root, _, names in os.walk(workdir):
    for name in names:
      if name.endswith(".json") and ".orbax-checkpoint-tmp" not in root:
        with open(os.path.join(root, name)) as f:
          json.load(f)
  if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    steps = [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
    assert steps == list(range(len(steps))), steps
  checkpoints = os.path.join(workdir, "checkpoints")
  for name in os.listdir(checkpoints) if os.path.isdir(checkpoints) else []:
    if name.isdigit() and os.path.exists(os.path.join(checkpoints, name, integrity.MANIFEST)):
      assert not integrity.check(epath.Path(checkpoints, name)), name


@pytest.mark.slow  # seven training processes
def test_a_run_killed_anywhere_ends_as_if_it_never_was(tmp_path):
  data_dir = str(tmp_path / "data")
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  subprocess.run(command(reference, data_dir), cwd=ROOT, check=True, capture_output=True, timeout=600)
  rng = random.Random(SEED)
  later = [(kind, rng.randrange(EVERY, STEPS - 2)) for kind in ("step", "save", "step", "save")]
  points = [("step", 1)] + sorted(later, key=lambda point: point[1])  # at startup, then across the run
  history = []
  for kind, step in points:
    proc = subprocess.Popen(command(killed, data_dir), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    history.append(kill_at(proc, killed, kind, step))
    check_whole(killed)
  subprocess.run(command(killed, data_dir), cwd=ROOT, check=True, capture_output=True, timeout=600)
  check_whole(killed)
  where = f"seed {SEED}: {'; '.join(history)}"
  with open(os.path.join(reference, "results.json")) as f, open(os.path.join(killed, "results.json")) as g:
    expected, got = json.load(f), json.load(g)
  assert got["final_val_loss"] == expected["final_val_loss"] and got["steps"] == STEPS, where
  assert [r["loss"] for r in read_jsonl(os.path.join(killed, "metrics.jsonl"))] == [
      r["loss"] for r in read_jsonl(os.path.join(reference, "metrics.jsonl"))], where
