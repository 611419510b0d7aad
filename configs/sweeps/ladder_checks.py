"""An intervention on the ladder study's one large reading (docs/studies.md, "The ladder study"): all_taper (+aux)
ends 20.7% and 9.6% below the baseline at `cpu_xs` and `cpu` and within 1.3% of it from `cpu_m` on, while
internal_taper (+aux), calibrated identically but with a plain final norm, shows no lead. What differs is the final
norm: at g = 0 all_taper's is the fixed map c·x with c = 5.3, 3.0 and 1.9 at those sizes (seed 0; `c/final_norm` in
the runs' metrics.jsonl). If that gain is the lead, the plain baseline with only its final norm's γ initialised at c
(`model.final_norm_gain_init`) reaches all_taper's loss or lower. The ladder's settings (untuned, 300 steps), 3 seeds.

    python -m experiments.sweep --sweep=configs/sweeps/ladder_checks.py --workdir=runs/ladder-checks
    python -m experiments.report --workdir=runs/ladder-checks --out=docs/ladder/final_gain
"""

import ml_collections

FINAL_C = {"cpu_xs": 5.3, "cpu": 3.0, "cpu_m": 1.9}  # all_taper (+aux)'s c of the final norm, ladder seed 0


def get_config() -> ml_collections.ConfigDict:
  """The grid: the baseline at each of three sizes with its final norm's γ starting at all_taper's final c there."""
  c = ml_collections.ConfigDict()
  c.name = "ladder-checks"
  c.seeds = (0, 1, 2)
  c.tuned = False  # the ladder's settings
  c.grids = [
    dict(
      variants=["baseline"],
      sizes=[size],
      tag=f"final{gain:g}",
      overrides=dict(model=dict(final_norm_gain_init=gain)),
    )
    for size, gain in FINAL_C.items()
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  return c
