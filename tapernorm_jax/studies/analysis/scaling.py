"""The scaling fits of a study (fits.py on its groups): each method's gap to the baseline and to its matched
control against parameters, each method's loss against training compute, and its compute multiplier; as tables and
a reading in words for report.md."""

import dataclasses
from collections.abc import Sequence

import numpy as np

from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.studies.analysis import coverage, fits
from tapernorm_jax.studies.analysis.aggregate import Group, control_of
from tapernorm_jax.studies.analysis.run_rows import (
  Key,
  Run,
  budgets,
  flops_per_token,
  label,
  size_order,
  split_size,
  variant_order,
)

BASELINE: Key = ("baseline", 0)
RESAMPLES = 300
MIN_LAW_SIZES = 3  # the loss-compute law has three parameters


@dataclasses.dataclass
class MethodFits:
  """One method's fits: its gap against the baseline and against its matched control, its loss-compute law and, per
  size it has, its compute multiplier against the baseline's law."""

  key: Key
  sizes: list[str]
  vs_baseline: fits.GapFit | None
  vs_control: fits.GapFit | None
  control: Key | None
  law: fits.ComputeFit | None  # None below MIN_LAW_SIZES sizes
  multipliers: list[fits.Interval]


@dataclasses.dataclass
class StudyFits:
  """Every method's fits, the baseline's law, and each size's parameters and training compute, along one token
  budget's ladder ("": the sizes' own steps)."""

  params: dict[str, float]
  compute: dict[str, float]
  baseline_law: fits.ComputeFit | None
  methods: list[MethodFits]
  budget: str = ""


def training_compute(runs: Sequence[Run]) -> dict[str, float]:
  """Training FLOPs per size: 6·N + 12·L·D·T per token × tokens, the median over its complete runs."""
  per_size: dict[str, list[float]] = {}
  for r in runs:
    per_token = flops_per_token(r.config, r.params) if r.status == "complete" and r.params and r.tokens else None
    if per_token:
      per_size.setdefault(r.size, []).append(per_token * r.tokens)
  return {size: float(np.median(v)) for size, v in per_size.items()}


def study_fits(runs: Sequence[Run], groups: Sequence[Group], resamples: int = RESAMPLES) -> StudyFits | None:
  """The fits of every method with at least 2 sizes beside the baseline's; None where the study has fewer."""
  compute = training_compute(runs)
  by_key: dict[Key, dict[str, Group]] = {}
  for g in groups:
    if g.n and g.params and g.size in compute:
      by_key.setdefault((g.variant, g.aux), {})[g.size] = g
  base = by_key.get(BASELINE, {})
  if len(base) < 2:
    return None
  params = {size: float(g.params) for size, g in base.items()}
  sizes_of = lambda key: sorted(set(by_key[key]) & set(base), key=size_order)
  base_sizes = sorted(base, key=size_order)
  base_law = None
  if len(base_sizes) >= MIN_LAW_SIZES:
    base_law = fits.compute_fit([compute[s] for s in base_sizes], [base[s].losses for s in base_sizes], resamples)
  methods = []
  for key in sorted(by_key, key=variant_order):
    sizes = sizes_of(key)
    if key == BASELINE or len(sizes) < 2:
      continue
    mine = [by_key[key][s].losses for s in sizes]
    n = [params[s] for s in sizes]
    vs_base = fits.gap_fit(n, mine, [base[s].losses for s in sizes], resamples)
    control_group = control_of(by_key[key][sizes[0]], groups)
    control = (control_group.variant, control_group.aux) if control_group else None
    vs_control = None
    if control and control != BASELINE and len(set(sizes) & set(by_key.get(control, {}))) == len(sizes):
      vs_control = fits.gap_fit(n, mine, [by_key[control][s].losses for s in sizes], resamples)
    c = [compute[s] for s in sizes]
    law, multipliers = None, []
    if len(sizes) >= MIN_LAW_SIZES:
      law = fits.compute_fit(c, mine, resamples)
      multipliers = fits.multiplier([base[s].losses for s in sizes], mine, c, resamples)
    methods.append(MethodFits(key, sizes, vs_base, vs_control, control, law, multipliers))
  return StudyFits(params, compute, base_law, methods)


def fits_by_budget(runs: Sequence[Run], groups: Sequence[Group], resamples: int = RESAMPLES) -> list[StudyFits]:
  """`study_fits` along each token budget's ladder (a study without a budget axis has one), budgets in size_order;
  a budget with too few sizes is left out."""
  fitted = []
  for budget in budgets(g.size for g in groups):
    mine = lambda items: [x for x in items if split_size(x.size)[1] == budget]
    if (study := study_fits(mine(runs), mine(groups), resamples)) is not None:
      fitted.append(dataclasses.replace(study, budget=budget))
  return fitted


def _pct(interval: fits.Interval) -> str:
  """A relative gap's interval in %."""
  return f"{100 * interval.value:+.2f}% [{100 * interval.low:+.2f}, {100 * interval.high:+.2f}]"


def gaps_markdown(study: StudyFits) -> str:
  """One row per method and reference: the gap at the smallest size, the exponent, the lack of fit and a reading."""
  rows = []
  for m in study.methods:
    for reference, fit in ((BASELINE, m.vs_baseline), (m.control, m.vs_control)):
      if fit is None:
        continue
      residuals = ", ".join(f"{r / e:+.1f}" if e > 0 else "—" for r, e in zip(fit.residuals, fit.pooled_errors))
      rows.append(
        [
          label(*m.key),
          label(*reference),
          ", ".join(m.sizes),
          _pct(fit.a),
          fit.b.text("{:.2f}"),
          residuals,
          f"{fit.lack_of_fit():.2g}",
          fit.reading(),
        ]
      )
  return markdown_table(
    [
      "method",
      "against",
      "sizes",
      "gap at the smallest, a",
      "exponent b",
      "residuals (standard errors)",
      "lack of fit p",
      "reading",
    ],
    rows,
  )


def compute_markdown(study: StudyFits) -> str:
  """One row per method (the baseline first): its law's E, A, α, and its compute multiplier at each size."""
  sizes = sorted(study.compute, key=size_order)
  rows = []
  for key, law, multipliers, mine in [(BASELINE, study.baseline_law, [], [])] + [
    (m.key, m.law, m.multipliers, m.sizes) for m in study.methods if m.law
  ]:
    at = dict(zip(mine, multipliers))
    cells = [at[s].text("{:.2f}") + "×" if s in at else "—" for s in sizes]
    rows.append(
      [
        label(*key),
        law.e.text("{:.3f}"),
        law.a.text("{:.3f}"),
        law.alpha.text("{:.2f}"),
        *(cells if key != BASELINE else ["1× (the reference)"] * len(sizes)),
      ]
    )
  head = ["method", "E", "A", "α", *(f"× compute at {s}" for s in sizes)]
  return markdown_table(head, rows)


COMPUTE_TEXT = (
  "Loss against training compute C (6·N + 12·L·D·T FLOPs per token × tokens), L(C) = E + A·(C/C₀)^(−α) with C₀ the "
  "smallest size's compute. The compute multiplier of a method at a size is the compute at which the baseline's law "
  "reaches the method's loss, divided by the compute the method was trained with: above 1 the method is worth more "
  "compute than it used, below 1 it costs compute (inf: the baseline's law never reaches that loss). With three "
  "sizes the three-parameter law goes through the points (no degree of freedom left): read its intervals, not its "
  "values."
)


def markdown(study: StudyFits) -> str:
  """The report's scaling section: what was fitted, the two tables, how to read them."""
  span = max(study.params.values()) / min(study.params.values())
  measured = coverage.sentence()  # how often such intervals held the truth in simulation ('' without the file)
  parts = [
    f"Fitted with scipy (Huber-loss least squares) over {len(study.params)} sizes spanning {span:.1f}× in "
    f"parameters. Every bracket is a {fits.LEVEL:.0%} bootstrap interval: each cell's mean drawn again with the "
    f"seeds' relative noise pooled over the fit's cells ({RESAMPLES} times; tapernorm_jax/studies/analysis/fits.py), "
    f"the whole fit "
    f"redone, and the percentile interval stretched by t/z for the noise's degrees of freedom. "
    f"{measured + ' ' if measured else ''}The gap is the relative difference of mean validation losses, "
    f"ΔL(N) = a·(N/N₀)^(−b) with N₀ the smallest size's parameters (b > 0: the gap shrinks with size); the "
    f"residuals are each size's measured gap minus the fitted one, in standard errors of that gap from the "
    f"seeds' relative noise pooled over every cell of the fit; \"lack of fit p\" is the chance that the seeds' "
    f"noise alone leaves residuals as large as the fit's (the sum of their squares over sizes − 2, against an F "
    f"distribution; small: the law does not describe the data).",
    "",
    gaps_markdown(study),
    "",
  ]
  if study.baseline_law is None:
    return "\n".join(
      parts
      + [
        f"No loss-compute law: the baseline has {len(study.params)} sizes, and the law's three "
        f"parameters need at least {MIN_LAW_SIZES}."
      ]
    )
  return "\n".join(parts + [COMPUTE_TEXT, "", compute_markdown(study)])
