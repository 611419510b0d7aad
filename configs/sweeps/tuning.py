"""The tuning study behind the methods study: every method at `cpu_xs`, `cpu` and `cpu_l` (the methods study's sizes,
300 steps) over the same budget of 9 settings, three learning rates × three values of the method's own setting, scored
on the tune split (the train stream's last 10%, whole documents, held out of training; `data.tune_frac`), never on
the validation split the methods study reports. One seed a setting (216 runs, and 42 more below for the reasons given
there; about 2.7 hours on 2 cores at the methods study's 35 s a run):

    python -m experiments.sweep --sweep=configs/sweeps/tuning.py --workdir=runs/tuning
    python -m experiments.report --workdir=runs/tuning    # tuning.md, tuning.json: each method's chosen setting

The methods' own settings, each spanning its authors' value and the values this width calls for:
- baseline (and its +aux control): the norms' gain at init, `model.norm_gain_init` 1 (the usual), 3, 10;
- TaperNorm (internal_taper, all_taper, +aux): the calibration step, 60, 100 (the default floor) or 150;
- FakeLN: the step its first norm is removed at, `fakeln.start` 30, 100, 200;
- PRepBN: the blend, λ = 1 for `prepbn.warm_frac` of the run then linear to 0 at `prepbn.blend_end`: the authors'
  shares (36% then to the last step), 20% to step 210, 10% to step 150 (the last two end while the LR can still move
  RepBN's parameters);
- DyT and Derf: α0 (`model.norm_alpha`, attention/MLP/final) at the authors' value for their widths, 5× and 25× it:
  their α0 falls as the width grows (DyT's Table 12: 0.8/0.2 at width 4096, 0.2/0.05 at 8192), and at d = 32–128 the
  authors' α0 leaves α·h at 0.02–0.09 at init, where theirs is near 1.
"""

import ml_collections

SIZES = ["cpu_xs", "cpu", "cpu_l"]
LRS = (1e-3, 3e-3, 1e-2)  # the presets' 3e-3 and a factor of ~3 either side
GAINS = {f"gain{g:g}": {"model.norm_gain_init": float(g)} for g in (1, 3, 10)}
CALIBRATIONS = {f"cal{s}": {"taper.gate_warmup_frac": s / 300, "taper.min_calibration_step": 0} for s in (60, 100, 150)}
SETTINGS = {  # variant → {knob tag: its overrides}
  "baseline": GAINS,
  "baseline:aux=1": GAINS,
  "internal_taper:aux=1": CALIBRATIONS,
  "all_taper:aux=1": CALIBRATIONS,
  "fakeln": {f"start{s}": {"fakeln.start": s} for s in (30, 100, 200)},
  "prepbn": {
    "blend36-299": {"prepbn.warm_frac": 0.36, "prepbn.blend_end": -1},
    "blend20-210": {"prepbn.warm_frac": 0.2, "prepbn.blend_end": 210},
    "blend10-150": {"prepbn.warm_frac": 0.1, "prepbn.blend_end": 150},
  },
  "dyt": {f"alpha{m}x": {"model.norm_alpha": (0.8 * m, 0.2 * m, 0.2 * m)} for m in (1, 5, 25)},
  "derf": {f"alpha{m}x": {"model.norm_alpha": (1.0 * m, 1.0 * m, 1.0 * m)} for m in (1, 5, 25)},
}
# Settings beyond the shared nine, each for a reason the nine showed (docs/studies.md, "Tuning"), LR included:
# - the point-wise norms, the regime their authors train in: their learning rate (3e-4–6e-4 in DyT's and Derf's
#   language models) and, as their thousands of warm-up steps do, a slower start. At the shared nine their final norm
#   saturates as the residual stream grows;
# - the other norm-based methods, the baseline's chosen gain (γ0 = 3 at every size) at their own best setting of the
#   nine and the two LRs it won at, so that the baseline's lead cannot be its gain alone.
GAIN3 = {"model.norm_gain_init": 3.0}
BEST_OF_NINE = {
  "internal_taper:aux=1": "cal60",
  "all_taper:aux=1": "cal60",
  "fakeln": "start100",
  "prepbn": "blend10-150",
}
EXTRA = {  # variant → {tag: overrides, the LR included}
  variant: {f"lr0.0003_alpha{m}x": {"opt.lr": 3e-4, **SETTINGS[variant][f"alpha{m}x"]} for m in (5, 25)}
  | {"lr0.001_alpha25x_warm30": {"opt.lr": 1e-3, "opt.warmup_frac": 0.3, **SETTINGS[variant]["alpha25x"]}}
  for variant in ("dyt", "derf")
} | {
  variant: {f"lr{lr:g}_{knob}_gain3": {"opt.lr": lr, **SETTINGS[variant][knob], **GAIN3} for lr in (3e-3, 1e-2)}
  for variant, knob in BEST_OF_NINE.items()
}


def nested(flat: dict) -> dict:
  """{"opt.lr": 1e-3} → {"opt": {"lr": 1e-3}}."""
  out: dict = {}
  for key, value in flat.items():
    section, field = key.split(".")
    out.setdefault(section, {})[field] = value
  return out


def get_config() -> ml_collections.ConfigDict:
  """One grid per method and setting (its tag `lr<lr>_<knob>`), over the sizes; the tune split held out."""
  c = ml_collections.ConfigDict()
  c.name = "tuning"
  c.seeds = (0,)
  c.tuned = False  # every setting from the defaults, whatever train/tuned.json holds
  c.grids = [
    dict(variants=[variant], sizes=SIZES, tag=f"lr{lr:g}_{knob}", overrides=nested({"opt.lr": lr, **overrides}))
    for variant, knobs in SETTINGS.items()
    for knob, overrides in knobs.items()
    for lr in LRS
  ] + [
    dict(variants=[variant], sizes=SIZES, tag=tag, overrides=nested(overrides))
    for variant, settings in EXTRA.items()
    for tag, overrides in settings.items()
  ]
  c.overrides = ml_collections.ConfigDict(dict(data=dict(tune_frac=0.1), train=dict(eval_batches=4)))
  return c
