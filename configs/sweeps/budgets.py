"""The budget study: baseline, its matched control baseline (+aux), internal_taper (+aux) and all_taper (+aux) at a
fixed number of training tokens per parameter over `cpu_xs`, `cpu`, `cpu_m` and `cpu_xl` (89K–936K parameters,
10.5×), 3 seeds (48 runs a budget). It asks the paper's question at a fixed budget per parameter: is the gap positive,
and does it shrink with size? One budget a study, so the largest size is predicted before it trains: 20 tokens per
parameter (compute-optimal; about 6 hours on 2 cores, estimated from the ladder's throughput in
docs/ladder/results.csv) and 5 (the early regime: the least at which `cpu_xs` still calibrates from step 100; about
1.5 hours). Interrupted, the same command resumes:

    python -m experiments.sweep --sweep=configs/sweeps/budgets.py:20 --workdir=runs/budgets-tpp20 --hold_out_largest
    python -m experiments.sweep --sweep=configs/sweeps/budgets.py:5 --workdir=runs/budgets-tpp5 --hold_out_largest
    python -m experiments.report --workdir=runs/budgets-tpp20
"""

import ml_collections


def get_config(tokens_per_param: str = "20") -> ml_collections.ConfigDict:
  """The grid: four variants × four sizes at one budget (`budgets.py:N`: N tokens per parameter), 3 seeds."""
  c = ml_collections.ConfigDict()
  c.name = f"budgets-tpp{tokens_per_param}"
  c.seeds = (0, 1, 2)
  c.grids = [
    dict(
      variants=["baseline", "baseline:aux=1", "internal_taper:aux=1", "all_taper:aux=1"],
      sizes=["cpu_xs", "cpu", "cpu_m", "cpu_xl"],
      budgets=[f"tokens_per_param={tokens_per_param}"],
    )
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  return c
