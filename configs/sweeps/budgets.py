"""The budget study: baseline, its matched control baseline (+aux), internal_taper (+aux) and all_taper (+aux) at a
fixed number of training tokens per parameter over `cpu_xs`, `cpu`, `cpu_m` and `cpu_xl` (89K–936K parameters,
10.5×), 3 seeds (48 runs a budget). It asks the paper's question at a fixed budget per parameter: is the gap positive,
and does it shrink with size? One budget a study, so the largest size is predicted before it trains: 20 tokens per
parameter (compute-optimal; about 6 hours on 2 cores, estimated from the ladder's throughput in
docs/ladder/results.csv) and 5 (the early regime: the least at which `cpu_xs` still calibrates from step 100; about
1.5 hours). Interrupted, the same command resumes:

    python -m experiments.sweep --sweep=configs/sweeps/budgets.py:20,gain=3 --workdir=runs/budgets-tpp20-gain3 \\
      --hold_out_largest
    python -m experiments.sweep --sweep=configs/sweeps/budgets.py:5 --workdir=runs/budgets-tpp5 --hold_out_largest
    python -m experiments.report --workdir=runs/budgets-tpp20-gain3

Every cell trains at the defaults, not the tuned presets (those were chosen at each size's own 300 steps), but for
the norms' initial gain where `gain=G` sets it: the tuning study chose γ0 = 3 for every norm-based method at every
size it tuned (docs/tuning/), so the 20-token study runs at it; the 5-token study ran at 1.
"""

import ml_collections


def get_config(arg: str = "20") -> ml_collections.ConfigDict:
  """The grid: four variants × four sizes at one budget (`budgets.py:N`: N tokens per parameter), 3 seeds;
  `budgets.py:N,gain=G` initialises every norm's gain at G (`model.norm_gain_init`; 1, the default, as the 5-token
  study ran)."""
  tokens_per_param, *rest = arg.split(",")
  options = dict(item.split("=", 1) for item in rest if "=" in item)
  unknown = [item for item in rest if "=" not in item or item.split("=", 1)[0] != "gain"]
  if unknown or not tokens_per_param.isdigit():
    raise ValueError(f"budgets.py:{arg}: give N or N,gain=G (N tokens per parameter, G the norms' initial gain)")
  gain = float(options.get("gain", 1))
  c = ml_collections.ConfigDict()
  c.name = f"budgets-tpp{tokens_per_param}" + (f"-gain{gain:g}" if gain != 1 else "")
  c.seeds = (0, 1, 2)
  c.grids = [
    dict(
      variants=["baseline", "baseline:aux=1", "internal_taper:aux=1", "all_taper:aux=1"],
      sizes=["cpu_xs", "cpu", "cpu_m", "cpu_xl"],
      budgets=[f"tokens_per_param={tokens_per_param}"],
    )
  ]
  c.overrides = ml_collections.ConfigDict(dict(train=dict(eval_batches=4)))
  if gain != 1:
    c.overrides.model = dict(norm_gain_init=gain)
  return c
