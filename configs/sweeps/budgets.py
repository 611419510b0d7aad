"""A token-budget axis on the CPU ladder: baseline, its matched control baseline (+aux) and internal_taper (+aux) at
1, 2 and 4 training tokens per parameter over `cpu_xs`, `cpu` and `cpu_m`, 3 seeds (81 runs). A method whose gap
changes sign with the budget shows it here; the report fits each budget's ladder on its own (docs/studies.md):

    python -m experiments.sweep --sweep=configs/sweeps/budgets.py --workdir=runs/budgets
    python -m experiments.report --workdir=runs/budgets
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The grid: three variants × three sizes × three budgets, 3 seeds."""
  c = ml_collections.ConfigDict()
  c.name = "budgets"
  c.seeds = (0, 1, 2)
  c.grids = [dict(variants=["baseline", "baseline:aux=1", "internal_taper:aux=1"], sizes=["cpu_xs", "cpu", "cpu_m"],
                  budgets=["tokens_per_param=1", "tokens_per_param=2", "tokens_per_param=4"])]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  return c
