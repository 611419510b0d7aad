"""The removal methods side by side (docs/method.md §7, §10, §14, §15): baseline and its matched control baseline
(+aux), TaperNorm as internal_taper (+aux) and all_taper (+aux), FakeLN, PRepBN, DyT and Derf, over three of the CPU
ladder's sizes (`cpu_xs`, `cpu`, `cpu_l`: 2 layers, d = 32/64/128, 0.09M–0.65M parameters, 300 steps of 16 × 128
tokens) on the offline synthetic corpus × 3 seeds. Tiny models on a synthetic corpus, not the paper's setting:

    python -m experiments.sweep --sweep=configs/sweeps/methods.py --workdir=runs/methods
    python -m experiments.report --workdir=runs/methods
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The grid: every method's variant with its default scale-loss setting, sizes, seeds."""
  c = ml_collections.ConfigDict()
  c.name = "methods"
  c.seeds = (0, 1, 2)
  c.grids = [
    dict(
      variants=[
        "baseline",
        "baseline:aux=1",
        "internal_taper:aux=1",
        "all_taper:aux=1",
        "fakeln",
        "prepbn",
        "dyt",
        "derf",
      ],
      sizes=["cpu_xs", "cpu", "cpu_l"],
    )
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  return c
