"""The CPU ladder as a scaling study: baseline, its matched control baseline (+aux), internal_taper (+aux) and
all_taper (+aux) over the five `cpu*` sizes (2 layers, d = 32–160, 89K–936K parameters, 300 steps of 16 × 128
tokens on the offline synthetic corpus) × 3 seeds; the report fits the gap and loss-compute laws
(docs/studies.md). Holding out the largest size predicts it before it trains:

    python -m experiments.sweep --sweep=configs/sweeps/ladder.py --workdir=runs/ladder --hold_out_largest
    python -m experiments.report --workdir=runs/ladder
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The grid: four variants over the CPU ladder, 3 seeds."""
  c = ml_collections.ConfigDict()
  c.name = "ladder"
  c.seeds = (0, 1, 2)
  c.tuned = False  # one protocol at every size: the presets cover only three of the five
  c.grids = [
    dict(
      variants=["baseline", "baseline:aux=1", "internal_taper:aux=1", "all_taper:aux=1"],
      sizes=["cpu_xs", "cpu", "cpu_m", "cpu_l", "cpu_xl"],
    )
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  return c
