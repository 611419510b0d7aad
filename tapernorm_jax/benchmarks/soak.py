"""A soak: one long run, and whether it stays flat after warm-up — resident memory and step time from its own
metrics.jsonl, and the files of its directory from a sampler that counts them while it trains.

    run(cfg, workdir)    trains (or resumes) with the sampler on; the summary below, with the run's results
    summary(...)         per window of steps: median resident memory (MB) and step time (ms); file counts
    figure(summary, p)   the three curves, one panel each
"""

import dataclasses
import os
import re
import threading
import time
from typing import Any

import matplotlib
import ml_collections
import numpy as np

from tapernorm_jax.storage import directory_lock, run_files
from tapernorm_jax.runtime import hardware
from tapernorm_jax.train import loop
from tapernorm_jax.train.metrics import read_jsonl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORBAX_STAGING = re.compile(r"\.orbax-checkpoint-tmp")  # a checkpoint Orbax is writing


@dataclasses.dataclass(frozen=True)
class Count:
  """The files of a run directory at one moment."""

  elapsed_s: float
  files: int  # every file under the directory
  staging: int  # staging files (NAME.tmp-<pid>) and checkpoints being written
  checkpoints: int  # complete checkpoint directories
  loose: int  # files outside the complete checkpoint directories: what a file left behind at each save grows


def count(run_dir: str, elapsed_s: float) -> Count:
  """Counts the files under `run_dir` now."""
  total = staging = loose = 0
  steps: list[str] = []
  checkpoints_dir = os.path.join(run_dir, "checkpoints")
  for root, dirs, names in os.walk(run_dir):  # one walk, so the counts agree on which checkpoints there were
    total += len(names)
    staging += sum(bool(directory_lock.STAGING.search(n)) for n in names)
    if root == checkpoints_dir:
      steps = list(dirs)
    inside = os.path.relpath(root, checkpoints_dir).split(os.sep)[0]
    loose += 0 if inside.isdigit() else len(names)
  staging += sum(bool(ORBAX_STAGING.search(d)) for d in steps)
  return Count(elapsed_s, total, staging, sum(d.isdigit() for d in steps), loose)


class Sampler:
  """Counts a run directory's files every `every_s` seconds on a daemon thread, from `start` to `stop`."""

  def __init__(self, run_dir: str, every_s: float):
    self.run_dir, self.every_s = run_dir, every_s
    self.counts: list[Count] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True, name="soak sampler")

  def start(self) -> None:
    self.started = time.time()
    self._thread.start()

  def stop(self) -> None:
    self._stop.set()
    self._thread.join()

  def _sample(self) -> None:
    while not self._stop.wait(self.every_s):
      try:
        self.counts.append(count(self.run_dir, time.time() - self.started))
      except FileNotFoundError:  # a file went while it was counted: the next sample counts again
        continue


def windows(
  records: list[dict[str, Any]], tokens_per_step: int, warmup_frac: float, number: int
) -> list[dict[str, Any]]:
  """After the first `warmup_frac` of the steps, `number` equal windows of steps: each one's first and last step,
  median resident memory (MB), median and lower-quartile step time (ms, from each step's tokens/s; the lower
  quartile is what the steps cost where other work on the host did not slow them), and the median CPU time the
  process spent a step (ms, all its threads: work that other processes on the host barely change)."""
  timed = [r for r in records if isinstance(r.get("tokens_per_s"), (int, float)) and r["tokens_per_s"] > 0]
  steady = timed[int(len(timed) * warmup_frac) :]
  out = []
  for part in np.array_split(np.arange(len(steady)), number):
    chunk = [steady[i] for i in part]
    if not chunk:
      continue
    rss = [r["host_rss_mb"] for r in chunk if isinstance(r.get("host_rss_mb"), (int, float))]
    step_ms = [1e3 * tokens_per_step / r["tokens_per_s"] for r in chunk]
    cpu_ms = [1e3 * r["host_cpu_s"] for r in chunk if isinstance(r.get("host_cpu_s"), (int, float))]
    out.append(
      {
        "first_step": chunk[0]["step"],
        "last_step": chunk[-1]["step"],
        "rss_mb": float(np.median(rss)) if rss else None,
        "step_ms": float(np.median(step_ms)),
        "fast_step_ms": float(np.percentile(step_ms, 25)),
        "cpu_step_ms": float(np.median(cpu_ms)) if cpu_ms else None,
      }
    )
  return out


def summary(
  cfg: ml_collections.ConfigDict, run_dir: str, counts: list[Count], warmup_frac: float = 0.1, number: int = 10
) -> dict[str, Any]:
  """What a soak shows: the windows, resident memory's growth and the step time's ratios (median, lower quartile)
  from the first window after warm-up to the last, and the most files the directory held between two saves (all
  kept checkpoints complete, nothing being written) in the first and the second half of the run, and the most files
  outside the complete checkpoints there (a checkpoint's own file count varies by a few from save to save; the files
  outside them do not)."""
  records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  parts = windows(records, cfg.train.batch_size * cfg.model.T, warmup_frac, number)
  settled = [c for c in counts if c.staging == 0 and c.checkpoints == cfg.checkpoint.keep]  # between two saves
  half = len(settled) // 2
  most = lambda part, field: max((getattr(c, field) for c in part), default=None)
  return {
    "steps": len(records),
    "warmup_frac": warmup_frac,
    "windows": parts,
    "rss_growth_mb": parts[-1]["rss_mb"] - parts[0]["rss_mb"] if parts and parts[0]["rss_mb"] else None,
    "step_time_ratio": parts[-1]["step_ms"] / parts[0]["step_ms"] if parts else None,
    "fast_step_time_ratio": parts[-1]["fast_step_ms"] / parts[0]["fast_step_ms"] if parts else None,
    "cpu_step_time_ratio": (
      parts[-1]["cpu_step_ms"] / parts[0]["cpu_step_ms"] if parts and parts[0]["cpu_step_ms"] else None
    ),
    "settled_files_first_half": most(settled[:half], "files"),
    "settled_files_second_half": most(settled[half:], "files"),
    "settled_loose_first_half": most(settled[:half], "loose"),
    "settled_loose_second_half": most(settled[half:], "loose"),
    "files_max": most(counts, "files"),
    "staging_max": most(counts, "staging"),
    "checkpoints_max": most(counts, "checkpoints"),
    "checkpoints_kept": cfg.checkpoint.keep,
    "final": dataclasses.asdict(count(run_dir, 0.0)),
    "counts": [dataclasses.asdict(c) for c in counts],
    "host": hardware.describe(),
  }


def run(
  cfg: ml_collections.ConfigDict, workdir: str, devices: list | None = None, sample_every_s: float = 0.5
) -> dict[str, Any]:
  """Trains (or resumes) the run in `workdir` with its directory sampled; the soak summary with the run's results."""
  sampler = Sampler(os.fspath(run_files.local_path(workdir, "--workdir")), sample_every_s)
  sampler.start()
  try:
    results = loop.run(cfg, workdir, devices=devices)
  finally:
    sampler.stop()
  return {
    **summary(cfg, os.fspath(run_files.local_path(workdir, "--workdir")), sampler.counts),
    "results": {k: results[k] for k in ("steps", "final_val_loss", "wall_time_s", "tokens_per_s")},
  }


def figure(soak: dict[str, Any], path: str, title: str) -> None:
  """Resident memory and step time per window of steps, and the directory's file count over the run."""
  steps = [(w["first_step"] + w["last_step"]) / 2 for w in soak["windows"]]
  fig, (rss, step, count_ax) = plt.subplots(1, 3, figsize=(14, 4))
  rss.plot(steps, [w["rss_mb"] for w in soak["windows"]], "o-", label="median per window")
  rss.set(xlabel="step", ylabel="resident memory (MB)", title="host memory after warm-up")
  step.plot(steps, [w["step_ms"] for w in soak["windows"]], "o-", color="C1", label="median per window")
  step.set(xlabel="step", ylabel="step time (ms)", title="step time after warm-up")
  for ax in (rss, step):
    ax.set_ylim(0, None)
    ax.legend()
  counts = soak["counts"]
  count_ax.plot([c["elapsed_s"] for c in counts], [c["files"] for c in counts], label="files")
  count_ax.plot([c["elapsed_s"] for c in counts], [c.get("loose") for c in counts], label="files outside checkpoints")
  count_ax.plot([c["elapsed_s"] for c in counts], [c["checkpoints"] for c in counts], label="complete checkpoints")
  count_ax.plot([c["elapsed_s"] for c in counts], [c["staging"] for c in counts], label="temporary (being written)")
  count_ax.set(xlabel="time since start (s)", ylabel="count", title="run directory")
  count_ax.legend()
  fig.suptitle(title)
  fig.tight_layout()
  with run_files.atomic_path(path) as tmp:
    fig.savefig(tmp, format="png", dpi=110)
  plt.close(fig)
