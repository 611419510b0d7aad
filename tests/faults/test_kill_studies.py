"""Fault injection, studies: a sweep (the local runner, two cells at once) killed with SIGKILL at seeded points and
launched again ends with every cell's uninterrupted losses, bit for bit; a report killed while it writes its figures
and run again writes what an uninterrupted report of the same study writes. After every kill nothing is half-written
(kills.check_whole). TAPERNORM_FAULT_SEED picks other points."""

import glob
import os
import sys

import pytest

import kills

STEPS, EVERY = 24, 6
CELLS = ("baseline-cpu-aux0-seed0", "all_taper-cpu-aux1-seed0")
ENV = {
  **os.environ,
  "XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
  "SOURCE_DATE_EPOCH": "1767225600",
}  # reports stamped with one time, whenever their minute


def sweep_file(tmp_path) -> str:
  """A two-cell sweep of a tiny model."""
  sweep = {
    "name": "tiny",
    "seeds": (0,),
    "grids": [dict(variants=["baseline", "all_taper"], sizes=["cpu"])],
    "overrides": {
      "model": {"D": 32, "H": 4, "L": 1, "T": 32, "V": 512},
      "train": {"steps": STEPS, "batch_size": 4, "log_every": 3, "diag_every": 6, "eval_batches": 1},
      "checkpoint": {"every": EVERY, "keep": 100},
      "taper": {"gate_warmup_frac": 0.25},
      "data": {"synthetic_train_stories": 200, "synthetic_valid_stories": 30, "data_dir": str(tmp_path / "data")},
    },
  }
  path = tmp_path / "tiny.py"
  path.write_text(f"import ml_collections\n\ndef get_config():\n  return ml_collections.ConfigDict({sweep!r})\n")
  return str(path)


def sweep_ready(study: str, kind: str, steps: int):
  """True once the cells' steps add up to `steps` (kind 'step'), and a save is in flight in one (kind 'save'; or
  once they add up to one interval more)."""

  def ready() -> bool:
    dirs = [os.path.join(study, cell) for cell in CELLS]
    reached = sum(kills.last_step(d) for d in dirs)
    return reached >= steps and (kind == "step" or any(kills.saving(d) for d in dirs) or reached >= steps + EVERY)

  return ready


def report_ready(out: str, figure: int):
  """True once the report is writing (or wrote) its `figure`-th figure."""
  return lambda: len(glob.glob(os.path.join(out, "figures", "*.png*"))) >= figure


@pytest.mark.slow  # four sweeps of two cells and four reports
def test_a_sweep_and_its_report_killed_anywhere_end_as_if_they_never_were(tmp_path):
  sweep = [sys.executable, "-m", "experiments.sweep", f"--sweep={sweep_file(tmp_path)}", "--parallel=2"]
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  kills.run([*sweep, f"--workdir={reference}"], env=ENV)
  draw = kills.rng("sweep")
  points = [("step", 1)] + sorted(
    ((kind, draw.randrange(EVERY, 2 * STEPS - 2)) for kind in ("step", "save")), key=lambda point: point[1]
  )
  history = []
  for kind, steps in points:
    proc = kills.start([*sweep, f"--workdir={killed}"], env=ENV)
    history.append(kills.kill_when(proc, sweep_ready(killed, kind, steps), f"{kind} {steps} of the cells' steps"))
    kills.check_whole(killed)
  kills.run([*sweep, f"--workdir={killed}"], env=ENV)
  kills.check_whole(killed)
  for cell in CELLS:
    kills.check_same_ending(os.path.join(reference, cell), os.path.join(killed, cell), STEPS, history)

  report = [sys.executable, "-m", "experiments.report", f"--workdir={killed}"]
  whole = str(tmp_path / "whole_report")
  kills.run([*report, f"--out={whole}"], env=ENV)
  figures = sorted(os.listdir(os.path.join(whole, "figures")))
  assert len(figures) >= 3, figures
  out, history = str(tmp_path / "killed_report"), []
  for figure in sorted(draw.randrange(1, len(figures) + 1) for _ in range(2)):
    proc = kills.start([*report, f"--out={out}"], env=ENV)
    history.append(kills.kill_when(proc, report_ready(out, figure), f"figure {figure}"))
    kills.check_whole(out)
  kills.run([*report, f"--out={out}"], env=ENV)
  kills.check_whole(out)
  where = f"seed {kills.SEED}: {'; '.join(history)}"
  assert all(line.startswith("killed") for line in history), where
  for name in ("report.md", "results.csv", *(os.path.join("figures", f) for f in figures)):
    with open(os.path.join(whole, name), "rb") as f, open(os.path.join(out, name), "rb") as g:
      assert f.read() == g.read(), (name, where)
