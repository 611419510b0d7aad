"""Time to first step, cold (an empty persistent compilation cache) and warm (the cache the cold run filled).

Each measurement is a fresh process (`python -m experiments.benchmark_first_step --child=CASE`), so nothing is
compiled yet when it starts; cold and warm alternate round by round, each warm run reading the cache its round's
cold run wrote. The time is from the process's start (imports included) to the first step's results on the host.

    dev_train   `./dev.sh train`'s run (all_taper at the cpu preset, data prepared once beforehand), to its first
                step's metrics (`loop.run`'s time_to_first_step_s)
    step_30m    the 30M all_taper train step alone: a Trainer, a fresh state, one step on a batch of 16 × 512
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from tapernorm_jax.runtime import hardware
from tapernorm_jax.markdown import markdown_table

CASES = ("dev_train", "step_30m")


@dataclasses.dataclass
class Settings:
  """Which cases and how many cold/warm rounds."""

  cases: tuple[str, ...] = CASES
  rounds: int = 3

  def __post_init__(self):
    unknown = [c for c in self.cases if c not in CASES]
    if unknown or not self.cases:
      raise ValueError(f"cases={','.join(self.cases)}: choose from {', '.join(CASES)}")
    if self.rounds < 1:
      raise ValueError(f"rounds={self.rounds}: must be >= 1")


def child(case: str, cache: str, workdir: str, started: float) -> float:
  """In a fresh process: runs `case` with the compilation cache in `cache`; seconds from `started` to its first
  step's results."""
  import jax
  import jax.numpy as jnp

  from tapernorm_jax.runtime import compilation_cache
  from tapernorm_jax.model import sharding
  from tapernorm_jax.train import loop, run_config
  from tapernorm_jax.train.trainer import Trainer

  if case == "dev_train":
    cfg = run_config.get_config("all_taper", "size=cpu")
    cfg.train.compilation_cache = cache
    called = time.time()
    return called - started + loop.run(cfg, workdir, stop_after=1)["time_to_first_step_s"]
  compilation_cache.use(cache)
  cfg = run_config.get_config("all_taper", "size=30m")
  trainer = Trainer(cfg, sharding.make_mesh())
  trainer.choose_paths()  # as a run does
  state = trainer.init_state(0)
  batch = jax.device_put(jnp.zeros((cfg.train.batch_size, cfg.model.T + 1), jnp.int32), trainer.batch_sharding)
  _, metrics = trainer.train_step(state, batch)
  jax.block_until_ready(metrics)
  return time.time() - started


def measure(case: str, cache: str, workdir: str) -> float:
  """Runs `case` in a fresh process; its time to first step."""
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.benchmark_first_step",
      f"--child={case}",
      f"--cache={cache}",
      f"--workdir={workdir}",
    ],
    capture_output=True,
    text=True,
    check=False,
    timeout=1800,
  )
  lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
  if done.returncode != 0 or not lines:
    raise RuntimeError(f"the {case} run failed (exit {done.returncode}): {done.stderr[-2000:]}")
  return json.loads(lines[-1])["first_step_s"]


def run(s: Settings) -> dict[str, Any]:
  """Cold and warm times of each case, alternated round by round."""
  rows = {}
  for case in s.cases:
    with tempfile.TemporaryDirectory() as tmp:  # the corpus and the CPU kernels are prepared once, before timing
      measure(case, "off", tmp)
    cold, warm = [], []
    for r in range(s.rounds):
      with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "xla")
        cold.append(measure(case, cache, os.path.join(tmp, "cold")))
        warm.append(measure(case, cache, os.path.join(tmp, "warm")))
      print(f"{case} round {r + 1}/{s.rounds}: cold {cold[-1]:.1f} s, warm {warm[-1]:.1f} s", flush=True)
    rows[case] = {"cold_s": cold, "warm_s": warm, "ratio": [c / w for c, w in zip(cold, warm, strict=True)]}
  return {"hardware": hardware.describe(), "settings": dataclasses.asdict(s), "cases": rows}


def markdown(results: dict[str, Any]) -> str:
  """The table: median cold and warm seconds, and the median of each round's cold/warm ratio (with its range)."""
  rows = []
  for case, r in results["cases"].items():
    ratio = r["ratio"]
    rows.append(
      [
        case,
        f"{statistics.median(r['cold_s']):.1f}",
        f"{statistics.median(r['warm_s']):.1f}",
        f"{statistics.median(ratio):.2f}× ({min(ratio):.2f}–{max(ratio):.2f})",
        len(ratio),
      ]
    )
  return markdown_table(["case", "cold s (median)", "warm s (median)", "cold / warm, per round", "rounds"], rows)
