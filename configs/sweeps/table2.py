"""The paper's Table 2 grid and the unanchored runs of its Figure 3 (Kanavalau, Amo Alonso and Lall,
arXiv 2602.10408; the setup is docs/method.md §8): TinyStories, 1m/3m/9m/30m × baseline,
internal_taper (+aux), all_taper (+aux) × 6 seeds, plus final_taper and all_taper without the aux
loss at 30m (84 runs), and the control the paper lacks: baseline (+aux), the scale loss without
tapering, at every size (24 runs; the report reads each tapered variant against it). 108 runs; on an
accelerator host run it as

    python -m experiments.sweep --sweep=configs/sweeps/table2.py --workdir=runs/table2

(one cell per device), on a cluster with --launch=ray, or with --launch=print for a scheduler, then
`python -m experiments.report --workdir=runs/table2`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The grid: variants (`variant` or `variant:aux=0|1`), sizes, seeds; shared `--config.X.Y` overrides."""
  c = ml_collections.ConfigDict()
  c.name = "table2"
  c.seeds = (0, 1, 2, 3, 4, 5)
  c.grids = [
    dict(
      variants=["baseline", "baseline:aux=1", "internal_taper:aux=1", "all_taper:aux=1"],
      sizes=["1m", "3m", "9m", "30m"],
    ),
    dict(variants=["final_taper:aux=0", "all_taper:aux=0"], sizes=["30m"]),  # Figure 3: unanchored
  ]
  # Shared --config overrides; offline, point the TinyStories builder at the two text files with
  # --sweep.overrides.data.manual_dir=DIR.
  c.overrides = ml_collections.ConfigDict(dict(data=dict(manual_dir="")))
  return c
