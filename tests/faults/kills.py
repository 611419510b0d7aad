"""The fault-injection suite's harness: start a writer, SIGKILL it once a seeded point of its life is reached, and
check that what it left is whole (every JSON parses, every figure opens, metrics have each step once, every
complete checkpoint and export matches its manifest).

TAPERNORM_FAULT_SEED picks other points; a failure names its seed and what was killed where, so it reproduces.
"""

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

from etils import epath
from PIL import Image

from tapernorm_jax.storage import integrity
from tapernorm_jax.studies.manifest import read_results
from tapernorm_jax.train.metrics import read_jsonl
from locations import ROOT

SEED = int(os.environ.get("TAPERNORM_FAULT_SEED", "0"))
TIMEOUT = 300  # seconds a writer may take to reach a point or to finish


def rng(name: str) -> random.Random:
  """This test's own seeded generator (a test's points do not move when another test draws more)."""
  return random.Random(f"{SEED}:{name}")


def last_step(workdir: str) -> int:
  """The last step in metrics.jsonl + 1 (0 before the first); a line being written is not counted."""
  step = 0
  path = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          step = max(step, json.loads(line)["step"] + 1)
        except (ValueError, KeyError):
          pass
  return step


def saving(workdir: str) -> bool:
  """Whether a checkpoint save is in flight: Orbax's temporary directory is there."""
  checkpoints = os.path.join(workdir, "checkpoints")
  return os.path.isdir(checkpoints) and any("tmp" in name for name in os.listdir(checkpoints))


def training_points(name: str, steps: int, every: int, count: int = 2) -> list[tuple[str, int]]:
  """At startup, then `count` seeded points across a run: ('step', n) or ('save', n), in order."""
  draw = rng(name)
  later = [(kind, draw.randrange(every, steps - 2)) for kind in ("step", "save") * (count // 2)]
  return [("step", 1)] + sorted(later, key=lambda point: point[1])


def training_ready(workdirs: Sequence[str], kind: str, step: int, every: int) -> Callable[[], bool]:
  """True once any of `workdirs` reached `step` (kind 'step'), or once a save after it is in flight (kind 'save'; after
  one more checkpoint interval if no save was seen)."""

  def ready() -> bool:
    for workdir in workdirs:
      reached = last_step(workdir)
      if reached >= step and (kind == "step" or saving(workdir) or reached >= step + every):
        return True
    return False

  return ready


def start(cmd: Sequence[str], **kwargs) -> subprocess.Popen:
  """Starts a writer from the repository root, its output discarded."""
  return subprocess.Popen(list(cmd), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)


def kill_when(procs: subprocess.Popen | Sequence[subprocess.Popen], ready: Callable[[], bool], what: str) -> str:
  """SIGKILLs every process in `procs` once `ready()` (polled every 2 ms); what happened, for the failure message."""
  procs = [procs] if isinstance(procs, subprocess.Popen) else list(procs)
  deadline = time.time() + TIMEOUT
  while time.time() < deadline:
    if all(p.poll() is not None for p in procs):
      return f"finished before {what}"
    if ready():
      for p in procs:
        p.send_signal(signal.SIGKILL)
      for p in procs:
        p.wait()
      return f"killed at {what}"
    time.sleep(0.002)
  for p in procs:
    p.kill()
  raise AssertionError(f"seed {SEED}: the writer did not reach {what} in {TIMEOUT} s")


def run(cmd: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
  """Runs a writer to the end; a failure shows its output."""
  done = subprocess.run(list(cmd), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT * 2, **kwargs)
  assert done.returncode == 0, f"seed {SEED}: {' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
  return done


def check_whole(directory: str) -> None:
  """Nothing under `directory` is half-written: every JSON parses (results.json also matches its checksum), every PNG
  opens, each metrics.jsonl has each step once and in order from 0, and every complete checkpoint or export matches its
  manifest."""
  for root, dirs, names in os.walk(directory):
    if ".orbax-checkpoint-tmp" in root or ".tmp-" in root:  # Orbax's and tapernorm's staging, not yet in place
      continue
    for name in names:
      path = os.path.join(root, name)
      if name == "results.json":
        read_results(root)
      elif name.endswith(".json"):
        with open(path) as f:
          json.load(f)
      elif name.endswith(".png"):
        with Image.open(path) as image:
          image.load()
      elif name == "metrics.jsonl":
        steps = [r["step"] for r in read_jsonl(path)]
        assert steps == list(range(len(steps))), (path, steps)
    complete = integrity.MANIFEST in names and (os.path.basename(root).isdigit() or "config.json" in names)
    if complete:  # a checkpoint step, or an export (its config.json is written after the manifest)
      assert not integrity.check(epath.Path(root)), (root, integrity.check(epath.Path(root)))


def check_same_ending(reference: str, killed: str, steps: int, history: Sequence[str]) -> None:
  """Every kill in `history` landed, and the run in `killed` ended as the uninterrupted one in `reference`: the same
  step count, final validation loss and every logged loss, bit for bit."""
  where = f"seed {SEED}: {'; '.join(history)}"
  assert all(line.startswith("killed") for line in history), where
  expected, got = (read_results(directory) for directory in (reference, killed))
  assert got["final_val_loss"] == expected["final_val_loss"] and got["steps"] == steps, (killed, where)
  losses = [[r["loss"] for r in read_jsonl(os.path.join(d, "metrics.jsonl"))] for d in (reference, killed)]
  assert losses[0] == losses[1], (killed, where)
