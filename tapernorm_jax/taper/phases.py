"""The step boundaries of a run's schedules, resolved from its config without jax (the report reads them)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Phases:
  """Step boundaries: LR warmup end, taper start (= gate warmup end, calibration) and taper end."""

  steps: int
  lr_warmup: int
  taper_start: int
  taper_end: int

  @classmethod
  def from_config(cls, cfg) -> "Phases":
    """Resolves fractions, the calibration floor and `taper_end=-1` (the last step) from a full config."""
    steps = cfg.train.steps
    taper_end = resolve_taper_end(cfg.taper.taper_end, steps)
    start = calibration_step(cfg.taper.gate_warmup_frac, cfg.taper.get("min_calibration_step", 0), steps, taper_end)
    return cls(steps=steps, lr_warmup=int(round(cfg.opt.warmup_frac * steps)), taper_start=start, taper_end=taper_end)


def resolve_taper_end(taper_end: int, steps: int) -> int:
  """`taper.taper_end`, with -1 meaning the last step (so the last update runs at g = 0)."""
  return steps - 1 if taper_end == -1 else taper_end


def calibration_step(gate_warmup_frac: float, floor: int, steps: int, taper_end: int) -> int:
  """round(gate_warmup_frac · steps), raised to `floor` where the run is long enough: a floor past half the run
  (or past the taper end) leaves the fraction, a short run that is warned about (methods/taper_norm.py)."""
  start = int(round(gate_warmup_frac * steps))
  return floor if start < floor <= min(steps // 2, taper_end) else start
