"""A CPU mini-study in the shape of Table 2 and Figure 3: the `cpu` preset (2 layers, d = 64, 300 steps of
16 × 128 tokens) on the offline synthetic corpus; baseline, its matched control baseline (+aux) (the scale loss
without tapering), internal_taper (+aux), all_taper (+aux) and the unanchored all_taper (aux=0) and final_taper ×
3 seeds. A tiny model on a synthetic corpus, not the paper's setting (docs/method.md §8). About a minute a cell on
2 CPU cores (docs/studies.md):

    python -m experiments.sweep --sweep=configs/sweeps/cpu_mini.py --workdir=runs/cpu_mini
    python -m experiments.report --workdir=runs/cpu_mini
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The grid: variants (`variant` or `variant:aux=0|1`), sizes, seeds; shared `--config.X.Y` overrides."""
  c = ml_collections.ConfigDict()
  c.name = "cpu_mini"
  c.seeds = (0, 1, 2)
  c.tuned = False  # the anchor at one shared LR (below), not each method at its best
  c.grids = [
    dict(
      variants=[
        "baseline",
        "baseline:aux=1",
        "internal_taper:aux=1",
        "all_taper:aux=1",
        "all_taper:aux=0",
        "final_taper:aux=0",
      ],
      sizes=["cpu"],
    )
  ]
  c.overrides = ml_collections.ConfigDict(
    dict(
      # Twice the preset's peak LR: in 300 steps the unanchored runs' logit growth then stands clear of the
      # anchored runs' (about 2× by the end, against 1.2× at 3e-3 even over 600 steps).
      opt=dict(lr=6e-3),
      train=dict(diag_every=15, eval_batches=4),
    )
  )  # logit norms every 15 steps for Figure 3
  return c
