"""PRepBN (Guo et al., 2024; docs/method.md §15): one global λ, 1 (the norm alone) for a warm-up, then linear to 0,
blending every `repbn` norm into RepBN(h) = BN(h) + η·h, whose running statistics are this method's EMAs (BatchNorm's
momentum as μ) and which folds into the next projection like a tapered norm."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from tapernorm_jax import config_fields
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.taper import losses, schedules

PyTree = Any
NAME = "prepbn"
# The `prepbn` section (method=prepbn, docs/method.md §15). The authors' LLaMA code (xinghaochen/SLAB, llama/modeling/
# llama-350M/modeling_llama.py) warms up for 10,000 steps with the norm alone, then takes λ from 1 to 0 linearly over
# 18,000; as shares of a run: the warm-up 10/28 of it, λ = 0 at its last step.
DEFAULTS = dict(
  warm_frac=0.36,  # λ = 1 (the norm alone) for this share of the steps; BatchNorm's statistics start after it
  blend_end=-1,  # the step λ reaches 0 at, linearly from the warm-up's end; -1 = the last step
  momentum=0.1,  # BatchNorm's running-statistics momentum (PyTorch's default, which the authors keep)
  scale_loss_weight=0.0,
)  # weight of FakeLN's batch scale loss; PRepBN has none (> 0: a +aux control)


@dataclasses.dataclass
class PRepBN:
  """One global λ: 1 (the norm alone) for a warm-up, then linear to 0, blending every `repbn` norm into RepBN; its
  BatchNorm statistics (batch statistics in training, running ones anywhere else) run from the warm-up's end."""

  cfg: ml_collections.ConfigDict
  model_cfg: ModelConfig
  phases: schedules.Phases

  def __post_init__(self):
    self.warm_end, self.off_step = prepbn_steps(self.cfg)
    self.mu = self.cfg.prepbn.momentum

  @staticmethod
  def check(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig, phases: schedules.Phases) -> None:
    """Raises ValueError naming the first bad `prepbn.*` field, or a model without RepBN norms."""
    del phases
    warm_end, off_step = prepbn_steps(cfg)
    config_fields.check(
      cfg,
      [
        (
          "repbn" in (model_cfg.internal_norm, model_cfg.final_norm),
          "model.internal_norm",
          "method=prepbn blends norms into RepBN: set model.internal_norm and/or model.final_norm to 'repbn' "
          "(the prepbn variant does)",
        ),
        (0.0 <= cfg.prepbn.warm_frac < 1.0, "prepbn.warm_frac", "must lie in [0, 1): the warm-up ends before the run"),
        (
          warm_end < off_step < cfg.train.steps,
          "prepbn.blend_end",
          f"λ must reach 0 after the warm-up ends (step {warm_end}) and before train.steps={cfg.train.steps}; "
          "-1 is the last step",
        ),
        (0.0 < cfg.prepbn.momentum <= 1.0, "prepbn.momentum", "BatchNorm's momentum must lie in (0, 1]"),
        (cfg.prepbn.scale_loss_weight >= 0, "prepbn.scale_loss_weight", "must be >= 0 (0 turns the scale loss off)"),
      ],
    )

  def gates(self, step: jax.Array) -> Gates:
    """λ on every norm: 1 until the warm-up's end, then linear to 0 at `prepbn.blend_end`."""
    span = max(self.off_step - self.warm_end, 1)
    lam = jnp.clip((self.off_step - jnp.asarray(step, jnp.float32)) / span, 0.0, 1.0)
    return Gates.uniform(lam, self.model_cfg.L)

  def calibrate(self, params: PyTree, calib: PyTree, step: jax.Array) -> tuple[PyTree, PyTree]:
    """Nothing to set at any step: BatchNorm's running statistics are the EMAs themselves."""
    del step
    return params, calib

  def stats_active(self, step: jax.Array) -> jax.Array:
    """The running statistics move from the warm-up's end on (before it BatchNorm takes no part in training)."""
    return step >= self.warm_end

  def scale_loss_terms(
    self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array, tokens_BxT: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """`prepbn.scale_loss_weight` (0 as published) and FakeLN's mean((s(h) − s̄)²), position 0 left out of s̄."""
    del calib, step
    ordinary_BxT = losses.ordinary_tokens(tokens_BxT)
    cfg = self.model_cfg
    return jnp.float32(self.cfg.prepbn.scale_loss_weight), losses.batch_scale_loss(
      h_BxTxD, cfg.norm_kind, cfg.eps, ordinary_BxT
    )


def prepbn_steps(cfg: ml_collections.ConfigDict) -> tuple[int, int]:
  """(the warm-up's end, the step λ reaches 0) of a PRepBN run."""
  steps = cfg.train.steps
  return int(round(cfg.prepbn.warm_frac * steps)), steps - 1 if cfg.prepbn.blend_end == -1 else cfg.prepbn.blend_end


METHOD = PRepBN  # the class methods/__init__.py registers under NAME
