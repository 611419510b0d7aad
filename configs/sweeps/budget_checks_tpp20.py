"""An intervention on the 20-tokens-per-parameter budget study's unexplained reading (docs/studies.md, "The budget
study"): the plain baseline ends 7.9% and 19.5% above its matched control, the baseline (+aux), at `cpu` and
`cpu_m`, its pre-logit rms growing to 55 where the scale loss holds the control's at 0.42. Every norm of the baseline
is scale-invariant, so the residual stream's scale changes no output; what it changes is the step Adam takes
relative to the weights, which shrinks as they grow. If that growth is the gap, holding the weights by other means,
AdamW's weight decay at 0.1 on the matrices (the usual setting for language models; the study trains without it),
closes most of it (`wd0.1`). And if holding the scale is what the control's scale loss does for it, the loss on the
batch's mean scale alone, (mean s(h) − s_tgt)², which leaves each token's scale free about it, does as well as the
method's mean over tokens of (s(h) − s_tgt)² (`mean`: taper.scale_loss_form = mean; the two differ by the tokens'
variance of s(h)). And at `cpu_xl`, where internal_taper (+aux) seed 0 ends 23% above its control, calibrated at
step 456 while block 0's attention-norm input (the embedding, rms 0.043 then) still grows 3.5×: if that drift is the
gap, calibrating at step 3000 narrows it (`cal3000`, seed 0). Calibration also starts the scale loss, on a
pre-logit state grown far from where the step-456 calibration held it, so the baseline (+aux) calibrated at step
3000 is `cal3000`'s matched control. Each run times the CPU paths and trains through the fastest, and at `cpu_xl`
both tapered runs chose `xla` where both controls chose `kernels`: the same computation up to rounding, but a
difference between the pairs, so `kernels` reruns internal_taper (+aux) seed 0 through its controls' path. And
the same cell on two hosts differs by up to 5% a seed at `cpu` but not at `cpu_xs`: the plain baseline at `cpu`,
seed 0, through each path on one host (`kernels`, `xla`) says how far the path alone moves a run. And at `cpu_xl`
the residual stream grows far more after calibration than at the smaller sizes (block 0's MLP input 42× in the tapered
run, 28× in its control: docs/budgets/tpp20/norm_swap.md), growth a norm absorbs and a fixed map passes on; if that is
the gap, weight decay 0.1, which held the stream 2–3× smaller at `cpu` and `cpu_m`, narrows it (`wd0.1` at `cpu_xl`,
seed 0, both runs through `kernels`). The study's budget and settings (γ0 = 3), 3 seeds.

    python -m experiments.sweep --sweep=configs/sweeps/budget_checks_tpp20.py --workdir=runs/budget-checks-tpp20
    .venv/bin/python scripts/intervention_table.py runs/budget-checks-tpp20 runs/budgets-tpp20-gain3 baseline:1
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  """The grid: the plain baseline with weight decay 0.1 at cpu and cpu_m, its control with the batch-mean scale
  loss at cpu, and internal_taper (+aux) with its control calibrated at step 3000, through the controls' CPU path,
  and with weight decay 0.1 beside its control, at cpu_xl, 20 tokens per parameter."""
  c = ml_collections.ConfigDict()
  c.name = "budget-checks-tpp20"
  c.seeds = (0, 1, 2)
  c.grids = [
    dict(
      variants=["baseline"],
      sizes=["cpu", "cpu_m"],
      budgets=["tokens_per_param=20"],
      tag="wd0.1",
      overrides=dict(opt=dict(weight_decay=0.1)),
    ),
    dict(
      variants=["baseline:aux=1"],
      sizes=["cpu"],
      budgets=["tokens_per_param=20"],
      tag="mean",
      overrides=dict(taper=dict(scale_loss_form="mean")),
    ),
    dict(
      variants=["internal_taper:aux=1", "baseline:aux=1"],
      sizes=["cpu_xl"],
      budgets=["tokens_per_param=20"],
      seeds=[0],
      tag="cal3000",
      overrides=dict(taper=dict(min_calibration_step=3000)),
    ),
    dict(
      variants=["internal_taper:aux=1"],
      sizes=["cpu_xl"],
      budgets=["tokens_per_param=20"],
      seeds=[0],
      tag="kernels",
      overrides=dict(train=dict(cpu_paths="kernels")),
    ),
    dict(
      variants=["internal_taper:aux=1", "baseline:aux=1"],
      sizes=["cpu_xl"],
      budgets=["tokens_per_param=20"],
      seeds=[0],
      tag="wd0.1",
      overrides=dict(opt=dict(weight_decay=0.1), train=dict(cpu_paths="kernels")),
    ),
    *(
      dict(
        variants=["baseline"],
        sizes=["cpu"],
        budgets=["tokens_per_param=20"],
        seeds=[0],
        tag=path,
        overrides=dict(train=dict(cpu_paths=path)),
      )
      for path in ("kernels", "xla")
    ),
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4), model=dict(norm_gain_init=3.0)))
  return c
