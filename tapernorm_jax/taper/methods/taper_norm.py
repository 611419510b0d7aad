"""TaperNorm (docs/method.md §3–§5): one global gate, 1 while the calibration EMAs run, every tapered norm calibrated
at the taper start (c* = num/(den + δ), γ̃ ← γ, s_tgt), then a half-cosine to 0; the fixed-target scale loss from
the taper start on."""

import dataclasses
import logging
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from tapernorm_jax import config_fields
from tapernorm_jax.model import ModelConfig, param_paths
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.taper import calibration, losses, schedules

PyTree = Any
NAME = "taper"
DEFAULTS = dict(  # the `taper` section
  gate_warmup_frac=0.05,  # gate = 1 (and calibration EMAs run) for this share of the steps
  min_calibration_step=100,  # ... and at least this many, where the run is long enough (schedules.Phases)
  taper_end=-1,  # step at which the gate reaches 0; -1 = the last step
  mu=0.01,  # EMA weight of the calibration statistics
  delta=1e-8,  # c* = num / (den + δ)
  scale_loss_weight=0.1,  # λ of the fixed-target scale loss, on from the taper start (0: off)
  scale_loss_form="token",  # token: mean over tokens of (s(h) − s_tgt)², the method's; mean: (mean s(h) − s_tgt)²
)
SCALE_LOSS_FORMS = ("token", "mean")  # `mean` holds only the batch's mean scale (an intervention, not the method)
# A calibration before this step is warned about: c came out at 3.9–46 at the cpu preset's step 15 and 48–49 at a
# 40-step 1m run's step 2, which then diverged (docs/methods/early_calibration/); at step 60, the tuning study's
# choice at cpu_xs, cpu and cpu_l, it is 1.7–21 (docs/tuning/). The paper calibrates at step 25,000 of 500,000.
EARLY_CALIBRATION = 50


@dataclasses.dataclass
class TaperNorm:
  """One global gate: 1 while the EMAs run, calibration of every tapered norm at the taper start, a half-cosine to 0."""

  cfg: ml_collections.ConfigDict
  model_cfg: ModelConfig
  phases: schedules.Phases

  def __post_init__(self):
    self.norms = param_paths.norms_in(self.model_cfg, ("taper",))  # these record statistics and get calibrated
    self.off_step = self.phases.taper_end  # every gate is 0 from here on
    self.mu = self.cfg.taper.mu

  @staticmethod
  def check(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig, phases: schedules.Phases) -> None:
    """Raises ValueError naming the first bad `taper.*` field; warns when nothing anchors the pre-logit scale."""
    config_fields.check(
      cfg,
      [
        (0.0 < cfg.taper.mu <= 1.0, "taper.mu", "the EMA weight μ must lie in (0, 1]"),
        (cfg.taper.scale_loss_weight >= 0, "taper.scale_loss_weight", "λ must be >= 0 (0 turns the scale loss off)"),
        (cfg.taper.delta >= 0, "taper.delta", "must be >= 0"),
        (
          cfg.taper.scale_loss_form in SCALE_LOSS_FORMS,
          "taper.scale_loss_form",
          f"choose one of {SCALE_LOSS_FORMS} (token, the method's, pulls every token's s(h) to the target)",
        ),
        (
          cfg.taper.min_calibration_step >= 0,
          "taper.min_calibration_step",
          "must be >= 0 (0: calibrate at round(gate_warmup_frac · steps), e.g. when fine-tuning a trained model)",
        ),
      ],
    )
    tapered = "taper" in (model_cfg.internal_norm, model_cfg.final_norm)
    if tapered and phases.taper_start < 1:
      raise ValueError(
        f"taper.gate_warmup_frac={cfg.taper.gate_warmup_frac} gives no warmup step; calibration "
        "needs at least one (raise it or train.steps)"
      )
    if tapered and phases.taper_start < EARLY_CALIBRATION:
      logging.warning(
        "calibration at step %d of %d (taper.gate_warmup_frac=%s; taper.min_calibration_step=%d "
        "applies only up to half the run), early in training: calibrations this early set c up to "
        "46–49 (the cpu preset's step 15; a 40-step 1m run's step 2, which then diverged: "
        "docs/methods/early_calibration). Read the run as a smoke test, or calibrate from step %d on "
        "(taper.min_calibration_step, where train.steps >= twice it)",
        phases.taper_start,
        phases.steps,
        cfg.taper.gate_warmup_frac,
        cfg.taper.min_calibration_step,
        EARLY_CALIBRATION,
      )
    if model_cfg.final_norm in ("taper", "fixed", "identity") and cfg.taper.scale_loss_weight == 0:
      logging.warning(
        "final_norm=%r with taper.scale_loss_weight=0: nothing anchors the pre-logit scale, so logits "
        "may grow without bound (logit chasing). A legitimate ablation; set taper.scale_loss_weight>0 "
        "to anchor.",
        model_cfg.final_norm,
      )

  def gates(self, step: jax.Array) -> Gates:
    """The global gate on every norm (1 throughout for a model without tapered norms, which nothing would gate)."""
    return Gates.uniform(schedules.gate(step, self.phases) if self.norms else 1.0, self.model_cfg.L)

  def calibrate(self, params: PyTree, calib: PyTree, step: jax.Array) -> tuple[PyTree, PyTree]:
    """c* = num/(den + δ), γ̃ ← γ and s_tgt at the taper start; unchanged at every other step."""
    calibrated = calibration.calibrate(params, calib, self.norms, self.mu, self.cfg.taper.delta)
    return tree_select(step == self.phases.taper_start, calibrated, (params, calib))

  def stats_active(self, step: jax.Array) -> jax.Array:
    """Every EMA runs until the taper start."""
    return step < self.phases.taper_start

  def scale_loss_terms(
    self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array, tokens_BxT: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """λ (from the taper start on) and the fixed-target scale loss mean((s(h) − s_tgt)²), or (mean s(h) − s_tgt)²
    with `taper.scale_loss_form=mean`."""
    del tokens_BxT
    weight = jnp.where(step >= self.phases.taper_start, self.cfg.taper.scale_loss_weight, 0.0)
    cfg, s_tgt = self.model_cfg, calibration.s_target(calib)
    if self.cfg.taper.scale_loss_form == "mean":
      return weight, losses.mean_scale_loss(h_BxTxD, s_tgt, cfg.norm_kind, cfg.eps)
    return weight, losses.scale_loss(h_BxTxD, s_tgt, cfg.norm_kind, cfg.eps)


def tree_select(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Leafwise `where` with a scalar predicate."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


METHOD = TaperNorm  # the class methods/__init__.py registers under NAME
