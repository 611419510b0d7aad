"""Interventions on the methods study's PRepBN jump (docs/studies.md, "The methods study"): at `cpu_l` its training
loss rises from 1.27 to 4.48 as its blend's λ goes from 0.25 to 0 (steps 120–150; seed 0) and recovers by the end.
At λ = 0 only RepBN(h) = BN(h) + η·h is left, and its BatchNorm weight and η start at 0 (PRepBN's init) while the
norm it replaces starts its gain at γ0 = 3 (the tuned preset): at step 100 the BatchNorm weights' rms is 0.05–0.16
against γ's 2.9–3.0 (the run's checkpoint), so the hand-over shrinks each norm's output several-fold. If that
mismatch is the jump, starting BatchNorm's weight at the norm's gain removes it (`bn3`: model.repbn_gain_init = 3),
and a smaller norm gain shrinks it (`gain1`: γ0 = 1, the authors'). The methods study's settings at `cpu_l`
otherwise, 3 seeds; the study's own PRepBN cells beside them (the `methods` directory's, or here with `study`).

    python -m experiments.sweep --sweep=configs/sweeps/prepbn_checks.py --workdir=runs/prepbn-checks
    .venv/bin/python scripts/jump_table.py runs/prepbn-checks
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The grid: PRepBN at cpu_l as the methods study ran it, with BatchNorm's weight at 3, and with γ0 = 1."""
  c = ml_collections.ConfigDict()
  c.name = "prepbn-checks"
  c.seeds = (0, 1, 2)
  c.grids = [
    dict(variants=["prepbn"], sizes=["cpu_l"]),
    dict(variants=["prepbn"], sizes=["cpu_l"], tag="bn3", overrides=dict(model=dict(repbn_gain_init=3.0))),
    dict(variants=["prepbn"], sizes=["cpu_l"], tag="gain1", overrides=dict(model=dict(norm_gain_init=1.0))),
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  return c
