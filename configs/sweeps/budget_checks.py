"""Interventions on the 5-tokens-per-parameter budget study's two unexplained readings (docs/studies.md, "The
budget study"), each at that study's budget and defaults, 3 seeds:

- all_taper (+aux)'s logits grow 2.04× and 1.70× from the taper start at `cpu_xs` and `cpu`, where its scale loss
  (λ = 0.1) settles 2–5× above its target. If a weak anchor is the cause, λ = 1 holds the pre-logit state nearer its
  target and the growth shrinks (`lambda1`).
- all_taper (+aux) ends 6.7% below both baselines at `cpu_xs`, where its final map's gain c·s(h) ends largest
  (3.3×). If larger norm gains are what helps there, the baseline (+aux) with γ initialised to 3 or 10 closes the gap
  (`gain3`, `gain10`).

    python -m experiments.sweep --sweep=configs/sweeps/budget_checks.py --workdir=runs/budget-checks
    .venv/bin/python scripts/intervention_table.py runs/budget-checks runs/budgets-tpp5   # beside the study's runs
"""

import ml_collections

BUDGET = "tokens_per_param=5"


def get_config() -> ml_collections.ConfigDict:
  """The grid: all_taper (+aux) at λ = 1 at cpu_xs and cpu; the baseline (+aux) at γ0 = 3 and 10 at cpu_xs."""
  c = ml_collections.ConfigDict()
  c.name = "budget-checks"
  c.seeds = (0, 1, 2)
  c.grids = [
    dict(
      variants=["all_taper:aux=1"],
      sizes=["cpu_xs", "cpu"],
      budgets=[BUDGET],
      tag="lambda1",
      overrides=dict(taper=dict(scale_loss_weight=1.0)),
    ),
  ] + [
    dict(
      variants=["baseline:aux=1"],
      sizes=["cpu_xs"],
      budgets=[BUDGET],
      tag=f"gain{g}",
      overrides=dict(model=dict(norm_gain_init=float(g))),
    )
    for g in (3, 10)
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  return c
