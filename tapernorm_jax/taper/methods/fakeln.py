"""FakeLN (Baroni et al., 2025; docs/method.md §10): norms replaced one at a time, every MLP norm, then every attention
norm's query/key path, then their value paths, then the final norm, each frozen at c = 1/σ_avg at its removal, with a
scale loss pulling each token's pre-logit scale to the batch mean. A frozen FakeLN is TaperLN at g = 0, so it runs
TaperNorm's norms, calibration state and fold."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import traverse_util

from tapernorm_jax import config_fields
from tapernorm_jax.model import ModelConfig, param_paths
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.taper import calibration, losses, schedules

PyTree = Any
NAME = "fakeln"
DEFAULTS = dict(  # the `fakeln` section (method=fakeln: one norm replaced at a time)
  start=20,  # the step the first MLP norm is replaced at
  gap_mlp=2,
  gap_attn=2,  # steps between consecutive MLP-norm / attention-norm (query/key path) removals
  gap_attn_v=3,  # steps between consecutive value-path removals, which start after the last query/key one
  gap_final=3,  # steps from the last value-path removal to the final norm
  mu=0.01,  # EMA weight of each norm's σ statistics (positions 1…T−1)
  sigma_steps=0,  # σ from the first this many steps only (1: the starting model's σ); 0: until each removal
  scale_loss_weight=0.1,  # λ of mean((s(h) − s̄)²), s̄ the batch mean of s(h) over ordinary tokens; from step 0
  eot_id=-1,
)  # the end-of-text token id, which s̄ leaves out with position 0 (-1: none)


@dataclasses.dataclass
class FakeLN:
  """Norms replaced one at a time (every MLP norm, then every attention norm's query/key path, then their value paths,
  then the final norm), each frozen at c = 1/σ_avg at its first removal, with a scale loss pulling each token's
  pre-logit scale to the batch mean of the ordinary tokens'."""

  cfg: ml_collections.ConfigDict
  model_cfg: ModelConfig
  phases: schedules.Phases

  def __post_init__(self):
    self.norms = param_paths.norms_in(self.model_cfg, ("taper",))
    self.removal, self.value_removal = removal_steps(self.model_cfg, self.cfg.fakeln)
    self.off_step = max(self.removal.values())  # the final norm's: after every value path (gap_final >= 0)
    self.mu = self.cfg.fakeln.mu

  @staticmethod
  def check(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig, phases: schedules.Phases) -> None:
    """Raises ValueError naming the first bad `fakeln.*` field, or a schedule that does not end before the run."""
    del phases
    config_fields.check(
      cfg,
      [
        (
          cfg.fakeln.start >= 1,
          "fakeln.start",
          "must be >= 1 (σ_avg needs at least one step of statistics before the first removal)",
        ),
        *[
          (cfg.fakeln[f] >= 0, f"fakeln.{f}", "must be >= 0")
          for f in ("gap_mlp", "gap_attn", "gap_attn_v", "gap_final")
        ],
        (0.0 < cfg.fakeln.mu <= 1.0, "fakeln.mu", "the EMA weight μ must lie in (0, 1]"),
        (
          cfg.fakeln.sigma_steps >= 0,
          "fakeln.sigma_steps",
          "must be >= 0 (0: σ until each norm's removal; N: from the first N steps)",
        ),
        (cfg.fakeln.scale_loss_weight >= 0, "fakeln.scale_loss_weight", "λ must be >= 0 (0 turns the scale loss off)"),
        (
          -1 <= cfg.fakeln.eot_id < model_cfg.V,
          "fakeln.eot_id",
          f"must be a token id below model.V={model_cfg.V}, or -1 (no end-of-text token)",
        ),
      ],
    )
    last = max(removal_steps(model_cfg, cfg.fakeln)[0].values())
    if last >= cfg.train.steps:
      raise ValueError(
        f"fakeln removes its last norm at step {last}, not before train.steps={cfg.train.steps}; "
        "lower fakeln.start or the gaps, or raise train.steps"
      )

  def gates(self, step: jax.Array) -> Gates:
    """Each norm's gate, and each attention norm's value path's: 1 before its removal step, 0 from it on."""
    on = lambda at: jnp.where(step >= at, 0.0, 1.0).astype(jnp.float32)
    blocks = lambda removal, name: jnp.stack(
      [on(removal[(param_paths.block(i), name)]) for i in range(self.model_cfg.L)]
    )
    return Gates(
      attn=blocks(self.removal, param_paths.ATTN_NORM),
      mlp=blocks(self.removal, param_paths.MLP_NORM),
      final=on(self.removal[(param_paths.FINAL_NORM,)]),
      attn_value=blocks(self.value_removal, param_paths.ATTN_NORM),
    )

  def calibrate(self, params: PyTree, calib: PyTree, step: jax.Array) -> tuple[PyTree, PyTree]:
    """At a norm's removal step: its c = 1/σ_avg and γ̃ ← γ; every other norm unchanged."""
    frozen_params, frozen_calib = calibration.fake_ln(params, calib, self.norms, self.mu)
    events = {norm: step == self.removal[norm] for norm in self.norms}
    return select_per_norm(events, frozen_params, params), select_per_norm(events, frozen_calib, calib)

  def stats_active(self, step: jax.Array) -> dict[param_paths.Path, jax.Array]:
    """A norm's σ EMA runs until its removal step, or for the first `fakeln.sigma_steps` steps only (the pre-logit
    monitor until the last removal)."""
    sigma_steps = self.cfg.fakeln.sigma_steps
    until = {n: min(self.removal[n], sigma_steps) if sigma_steps else self.removal[n] for n in self.norms}
    return {(param_paths.PRE_LOGIT,): step < self.off_step, **{n: step < until[n] for n in self.norms}}

  def scale_loss_terms(
    self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array, tokens_BxT: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    """λ (from step 0) and mean((s(h) − s̄)²) over every token, s̄ the batch mean over the tokens neither at position
    0 nor end-of-text, held constant."""
    del calib, step
    ordinary_BxT = losses.ordinary_tokens(tokens_BxT, self.cfg.fakeln.eot_id)
    cfg = self.model_cfg
    return jnp.float32(self.cfg.fakeln.scale_loss_weight), losses.batch_scale_loss(
      h_BxTxD, cfg.norm_kind, cfg.eps, ordinary_BxT
    )


def removal_steps(model_cfg: ModelConfig, fakeln: ml_collections.ConfigDict) -> tuple[dict, dict]:
  """({norm: the step it is replaced at (an attention norm's query/key path)}, {attention norm: the step its value
  path is}): MLP norms of blocks 0…L−1 from `start`, `gap_mlp` apart; then the attention norms' query/key paths,
  `gap_attn` apart; then their value paths, `gap_attn_v` apart; the final norm `gap_final` after the last."""
  sites = param_paths.norm_sites(model_cfg)
  mlp = [s.norm for s in sites if s.norm[-1] == param_paths.MLP_NORM]
  attn = [s.norm for s in sites if s.norm[-1] == param_paths.ATTN_NORM]
  steps = {norm: fakeln.start + i * fakeln.gap_mlp for i, norm in enumerate(mlp)}
  qk_start = fakeln.start + len(mlp) * fakeln.gap_mlp
  steps.update({norm: qk_start + i * fakeln.gap_attn for i, norm in enumerate(attn)})
  v_start = qk_start + len(attn) * fakeln.gap_attn
  value_steps = {norm: v_start + i * fakeln.gap_attn_v for i, norm in enumerate(attn)}
  steps[(param_paths.FINAL_NORM,)] = v_start + (len(attn) - 1) * fakeln.gap_attn_v + fakeln.gap_final
  return steps, value_steps


def select_per_norm(preds: dict[param_paths.Path, jax.Array], on_true: PyTree, on_false: PyTree) -> PyTree:
  """Entries under each norm path from `on_true` where that norm's predicate holds, else from `on_false`."""
  flat_true, flat_false = traverse_util.flatten_dict(on_true), traverse_util.flatten_dict(on_false)
  out = {}
  for key, old in flat_false.items():
    pred = next((p for norm, p in preds.items() if key[: len(norm)] == norm), None)
    out[key] = old if pred is None else jnp.where(pred, flat_true[key], old)
  return traverse_util.unflatten_dict(out)


METHOD = FakeLN  # the class methods/__init__.py registers under NAME
