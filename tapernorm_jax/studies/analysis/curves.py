"""Per-step metrics of a study's complete runs (metrics.jsonl), read once and grouped by size and variant, as
(steps, values) series for the figures and the dynamics table."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tapernorm_jax.studies.analysis.run_rows import FINISHED, Key, Run, read_metrics, size_order, variant_order
from tapernorm_jax.taper import phases


def series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the records that hold a finite number under `key`."""
  pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
  if not pairs:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*pairs)
  return np.asarray(steps, float), np.asarray(values, float)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
  """Trailing moving average over `window` points (shorter at the start)."""
  if window <= 1 or len(values) == 0:
    return values
  cumsum = np.cumsum(np.insert(values, 0, 0.0))
  idx = np.arange(1, len(values) + 1)
  lo = np.maximum(idx - window, 0)
  return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def mean_curve(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
  """The mean over seeds at the steps every seed logged."""
  common = curves[0][0]
  for steps, _ in curves[1:]:
    common = np.intersect1d(common, steps)
  values = [np.interp(common, s, v) for s, v in curves]
  return common, np.mean(values, axis=0)


def taper_start(config: Mapping[str, Any]) -> int | None:
  """The step at which the gate starts to fall (phases.calibration_step; a config without the floor had none)."""
  try:
    taper, steps = config["taper"], config["train"]["steps"]
    end = phases.resolve_taper_end(taper.get("taper_end", -1), steps)
    return phases.calibration_step(taper["gate_warmup_frac"], taper.get("min_calibration_step", 0), steps, end)
  except (KeyError, TypeError):
    return None


class Curves:
  """Metrics of the finished runs (those that learned no context too), read once, grouped by size and (variant, aux)."""

  def __init__(self, runs: Sequence[Run], max_points: int = 2000) -> None:
    self.runs = [r for r in runs if r.status in FINISHED and r.path]
    self.records = {r.cell: read_metrics(r.path, max_points) for r in self.runs}

  def sizes(self) -> list[str]:
    """Sizes with complete runs, smallest first."""
    return sorted({r.size for r in self.runs}, key=size_order)

  def by_key(self, size: str) -> dict[Key, list[Run]]:
    """Complete runs of one size by (variant, aux), in the table's variant order."""
    out: dict[Key, list[Run]] = {}
    for r in sorted(self.runs, key=lambda r: (variant_order(r.key), r.seed)):
      if r.size == size:
        out.setdefault(r.key, []).append(r)
    return out

  def curves(self, runs: Sequence[Run], key: str, window: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """(steps, values) per run for a metric, optionally smoothed; runs without the metric are left out."""
    out = []
    for r in runs:
      steps, values = series(self.records[r.cell], key)
      if len(steps):
        out.append((steps, smooth(values, window)))
    return out
