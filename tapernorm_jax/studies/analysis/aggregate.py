"""Table 2 over a study's runs: each size × variant's final validation loss, mean ± std over its seeds, the gap to
the baseline and to the matched control (the baseline with the same scale-loss setting), and the paper's numbers to
set beside them."""

import dataclasses
from collections.abc import Sequence

import numpy as np

from tapernorm_jax.studies.analysis import fits
from tapernorm_jax.studies.analysis.run_rows import FINISHED, Run, size_order, variant_order
from tapernorm_jax.taper.variants import SIZES

# Kanavalau, Amo Alonso and Lall, "Gated Normalization Removal and Scale Anchoring in Pre-Norm Transformers"
# (arXiv 2602.10408), Table 2: TinyStories validation loss (nats/token) at g = 0, mean ± std over 6 seeds.
# Keys: (size, variant, aux). The setup is docs/method.md §8.
PAPER_TABLE2 = {
  ("1m", "baseline", 0): (2.1538, 0.0025),
  ("1m", "internal_taper", 1): (2.1852, 0.0040),
  ("1m", "all_taper", 1): (2.1930, 0.0035),
  ("3m", "baseline", 0): (1.7561, 0.0010),
  ("3m", "internal_taper", 1): (1.7828, 0.0029),
  ("3m", "all_taper", 1): (1.7874, 0.0028),
  ("9m", "baseline", 0): (1.4620, 0.0022),
  ("9m", "internal_taper", 1): (1.4837, 0.0016),
  ("9m", "all_taper", 1): (1.4837, 0.0023),
  ("30m", "baseline", 0): (1.2768, 0.0018),
  ("30m", "internal_taper", 1): (1.2859, 0.0010),
  ("30m", "all_taper", 1): (1.2868, 0.0041),
}


@dataclasses.dataclass
class Group:
  """The seeds of one size × variant: val loss mean ± sample std (ddof = 1) over the complete ones."""

  size: str
  variant: str
  aux: int
  losses: list[float]
  expected: int  # runs of this group in the study (complete or not)
  params: int | None = None
  no_context: list[float] = dataclasses.field(default_factory=list)  # losses of seeds that learned no context
  gap_pct: float | None = None  # relative to the baseline at the same size, in %

  @property
  def n(self) -> int:
    """Seeds that count (complete, finite loss)."""
    return len(self.losses)

  @property
  def mean(self) -> float | None:
    """Mean final val loss."""
    return float(np.mean(self.losses)) if self.losses else None

  @property
  def std(self) -> float | None:
    """Sample standard deviation (None below 2 seeds)."""
    return float(np.std(self.losses, ddof=1)) if self.n >= 2 else None


@dataclasses.dataclass(frozen=True)
class Gap:
  """A group's mean val loss against a reference group's, in % of the reference's mean, with the standard error of
  the ratio of the means (the delta method, fits.gap_error) in the same unit; None below 2 seeds on either side."""

  pct: float
  se_pct: float | None

  @property
  def inside_noise(self) -> bool | None:
    """Whether the gap is smaller than two standard errors (None when there is no standard error)."""
    return None if self.se_pct is None else abs(self.pct) < 2 * self.se_pct


def gap(group: Group, reference: Group) -> Gap | None:
  """`group` against `reference`; None unless both have a complete seed."""
  if group.mean is None or reference.mean is None:
    return None
  se = 100.0 * fits.gap_error(group.losses, reference.losses) if group.n > 1 and reference.n > 1 else None
  return Gap(100.0 * (group.mean - reference.mean) / reference.mean, se)


def control_of(group: Group, groups: Sequence[Group]) -> Group | None:
  """The matched control of a tapered group: the baseline of its size with its scale-loss setting (None for the
  baselines themselves, or when the study has no such baseline)."""
  if group.variant == "baseline":
    return None
  return next((g for g in groups if (g.size, g.variant, g.aux) == (group.size, "baseline", group.aux)), None)


def aggregate(runs: Sequence[Run]) -> list[Group]:
  """One Group per size × (variant, aux), ordered by size then variant; gaps against the baseline."""
  groups: dict[tuple[str, str, int], Group] = {}
  for run in runs:
    g = groups.setdefault((run.size, run.variant, run.aux), Group(run.size, run.variant, run.aux, [], 0))
    g.expected += 1
    if run.status in FINISHED and run.final_val_loss is not None:
      (g.losses if run.status == "complete" else g.no_context).append(run.final_val_loss)
      g.params = run.params if g.params is None else g.params
  for g in groups.values():
    ref = groups.get((g.size, "baseline", 0))
    if ref is not None and ref.mean is not None and g.mean is not None and (g.variant, g.aux) != ("baseline", 0):
      g.gap_pct = 100.0 * (g.mean - ref.mean) / ref.mean
  return sorted(groups.values(), key=lambda g: (size_order(g.size), g.size, variant_order((g.variant, g.aux))))


def paper_setting(runs: Sequence[Run]) -> bool:
  """True when the complete runs are the paper's setting: TinyStories, the paper's sizes and step counts."""
  done = [r for r in runs if r.status == "complete"]
  return bool(done) and all(
    r.corpus == "tinystories" and r.size in ("1m", "3m", "9m", "30m") and r.steps == SIZES[r.size]["steps"]
    for r in done
  )
