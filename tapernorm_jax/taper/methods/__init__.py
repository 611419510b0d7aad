"""How norms are removed during training: each method, one module here, answers the same four questions.

    gates(step)                 which gate each norm gets (`model.gates.Gates`, one field per norm position)
    calibrate(params, calib, step)   when and how each norm's inference map is set
    stats_active(step)          which calibration EMAs still run (μ: the method's `mu`)
    scale_loss_terms(h, calib, step, tokens)  the loss added to cross-entropy: (its weight now, its unweighted value)

plus `check` (its config section's errors, before compiling), `off_step` (every gate 0 from here on) and its config
section's defaults (`DEFAULTS`, the section named `NAME`). Every decision is a function of the traced step, so no
method recompiles when a gate changes.

    taper_norm.py   TaperNorm: one global gate, calibration of every tapered norm at once (docs/method.md §3–§5)
    fakeln.py       FakeLN: one norm at a time, each frozen at 1/σ_avg (§10); TaperNorm's norms, state and fold
    prepbn.py       PRepBN: one global λ blending every norm into RepBN, BatchNorm's running statistics (§15)

A new method is one module that names its class `METHOD`, its config section `NAME` and that section's `DEFAULTS`,
added to `MODULES`, plus its configs (docs/architecture.md).
"""

import ml_collections
from absl import logging

from tapernorm_jax.model import ModelConfig
from tapernorm_jax.taper import schedules
from tapernorm_jax.taper.methods import fakeln, prepbn, taper_norm
from tapernorm_jax.taper.methods.fakeln import FakeLN, removal_steps
from tapernorm_jax.taper.methods.prepbn import PRepBN, prepbn_steps
from tapernorm_jax.taper.methods.taper_norm import TaperNorm

MODULES = (taper_norm, fakeln, prepbn)
CLASSES = {module.NAME: module.METHOD for module in MODULES}
METHODS = tuple(CLASSES)
DEFAULTS = {module.NAME: module.DEFAULTS for module in MODULES}  # each method's config section
DEFAULT = "taper"  # configs without a `method` field (written before FakeLN) are TaperNorm runs
Method = TaperNorm | FakeLN | PRepBN

__all__ = [
  "CLASSES",
  "DEFAULT",
  "DEFAULTS",
  "METHODS",
  "FakeLN",
  "PRepBN",
  "TaperNorm",
  "build",
  "name",
  "prepbn_steps",
  "removal_steps",
  "scale_loss_weight",
  "validate",
]


def name(cfg: ml_collections.ConfigDict) -> str:
  """The method `cfg.method` names (TaperNorm where the field is absent); ValueError for an unknown one."""
  method = cfg.get("method", DEFAULT)
  if method not in METHODS:
    raise ValueError(f"method={method!r}: choose one of {METHODS}")
  return method


def validate(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig, phases: schedules.Phases) -> None:
  """The checks of the method `cfg.method` names (before anything compiles)."""
  method = name(cfg)
  if method != "prepbn" and "repbn" in (model_cfg.internal_norm, model_cfg.final_norm):
    raise ValueError(
      f"method={method!r} with a 'repbn' norm: only method=prepbn moves RepBN's gate and statistics; "
      "set method=prepbn (the prepbn variant does) or another norm mode"
    )
  CLASSES[method].check(cfg, model_cfg, phases)
  for line in unused_settings(cfg, method):
    logging.warning(line)


def unused_settings(cfg: ml_collections.ConfigDict, method: str) -> list[str]:
  """One line per field of another removal method's section (fakeln, prepbn) set away from its default: the run's
  method reads none of them. (The `taper` section is shared: configs set it for every variant; so is every section's
  scale_loss_weight, which the variant's aux sets.)"""
  return [
    f"{section}.{field}={cfg[section][field]!r} does nothing for variant {cfg.get('variant', '?')!r}: it "
    f"trains with method={method!r}, which reads no {section}.* field (drop it, or choose the {section} variant)"
    for section, defaults in DEFAULTS.items()
    if section not in (method, DEFAULT) and section in cfg
    for field, default in defaults.items()
    if field != "scale_loss_weight" and field in cfg[section] and cfg[section][field] != default
  ]


def scale_loss_weight(cfg: ml_collections.ConfigDict) -> float:
  """The λ of the scale loss the run's method adds (`<its section>.scale_loss_weight`)."""
  return float(cfg[name(cfg)].scale_loss_weight)


def build(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig, phases: schedules.Phases) -> Method:
  """The method `cfg.method` names."""
  return CLASSES[name(cfg)](cfg, model_cfg, phases)
