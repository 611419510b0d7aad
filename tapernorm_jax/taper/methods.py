"""How norms are removed during training: TaperNorm and FakeLN as two answers to the same four questions.

    gates(step)                 which gate each norm gets (a scalar for all, or one per norm in layout order)
    calibrate(params, calib, step)   when and how each norm's fixed map (c, γ̃) is set
    stats_active(step)          which calibration EMAs still run
    aux_terms(h, calib, step)   the anchoring loss added to cross-entropy: (weight, unweighted value)

Both run every removable norm in the `taper` form, so they share the model, the calibration
state, the `fixed` g = 0 form and the fold: a frozen FakeLN, ((x − μ_x)/σ_avg)·γ + β, is TaperLN
at g = 0 with c = 1/σ_avg and γ̃ = γ (docs/method.md §10). They differ in timing: TaperNorm moves
one global gate along a half-cosine after calibrating every norm at once; FakeLN switches each
norm's gate from 1 to 0 at its own step, calibrating it there. Every decision is a function of
the traced step, so neither recompiles when a gate changes.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import traverse_util

from tapernorm_jax.model import ModelConfig, param_paths
from tapernorm_jax.taper import calibration, losses, schedules

PyTree = Any
METHODS = ("taper", "fakeln")


@dataclasses.dataclass
class TaperNorm:
  """One global gate: 1 while the EMAs run, calibration of every tapered norm at the taper start, a half-cosine to 0."""

  cfg: ml_collections.ConfigDict
  model_cfg: ModelConfig
  phases: schedules.Phases

  def __post_init__(self):
    self.norms = param_paths.norms_in(self.model_cfg, ("taper",))  # these record statistics and get calibrated
    self.off_step = self.phases.taper_end  # every gate is 0 from here on

  def gates(self, step: jax.Array) -> jax.Array:
    """The global gate (1 throughout for a model without tapered norms, which nothing would gate)."""
    return schedules.gate(step, self.phases) if self.norms else jnp.float32(1.0)

  def calibrate(self, params: PyTree, calib: PyTree, step: jax.Array) -> tuple[PyTree, PyTree]:
    """c* = num/(den + δ), γ̃ ← γ and s_tgt at the taper start; unchanged at every other step."""
    calibrated = calibration.calibrate(params, calib, self.norms, self.cfg.taper.mu, self.cfg.taper.delta)
    return tree_select(step == self.phases.taper_start, calibrated, (params, calib))

  def stats_active(self, step: jax.Array) -> jax.Array:
    """Every EMA runs until the taper start."""
    return step < self.phases.taper_start

  def aux_terms(self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """λ (from the taper start on) and the fixed-target scale loss mean((s(h) − s_tgt)²)."""
    weight = jnp.where(step >= self.phases.taper_start, self.cfg.taper.aux_weight, 0.0)
    cfg = self.model_cfg
    return weight, losses.scale_loss(h_BxTxD, calibration.s_target(calib), cfg.norm_kind, cfg.eps)


@dataclasses.dataclass
class FakeLN:
  """Norms replaced one at a time (every MLP norm, then every attention norm, then the final norm), each frozen at
  c = 1/σ_avg at its own step, with an aux loss pulling each token's pre-logit scale to the batch mean."""

  cfg: ml_collections.ConfigDict
  model_cfg: ModelConfig
  phases: schedules.Phases

  def __post_init__(self):
    self.norms = param_paths.norms_in(self.model_cfg, ("taper",))
    self.removal = removal_steps(self.model_cfg, self.cfg.fakeln)
    self.off_step = max(self.removal.values())
    self._order = [site.norm for site in param_paths.norm_sites(self.model_cfg)]

  def gates(self, step: jax.Array) -> jax.Array:
    """One gate per norm: 1 before its removal step, 0 from it on."""
    return jnp.stack([jnp.where(step >= self.removal[norm], 0.0, 1.0) for norm in self._order]).astype(jnp.float32)

  def calibrate(self, params: PyTree, calib: PyTree, step: jax.Array) -> tuple[PyTree, PyTree]:
    """At a norm's removal step: its c = 1/σ_avg and γ̃ ← γ; every other norm unchanged."""
    frozen_params, frozen_calib = calibration.fake_ln(params, calib, self.norms, self.cfg.taper.mu)
    events = {norm: step == self.removal[norm] for norm in self.norms}
    return select_per_norm(events, frozen_params, params), select_per_norm(events, frozen_calib, calib)

  def stats_active(self, step: jax.Array) -> dict[param_paths.Path, jax.Array]:
    """A norm's σ EMA runs until its removal step (the pre-logit monitor until the last one)."""
    return {(param_paths.PRE_LOGIT,): step < self.off_step, **{n: step < self.removal[n] for n in self.norms}}

  def aux_terms(self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """λ (from the first removal on) and mean((s(h) − mean_batch s(h))²), the batch mean held constant."""
    weight = jnp.where(step >= min(self.removal.values()), self.cfg.fakeln.aux_weight, 0.0)
    cfg = self.model_cfg
    return weight, losses.batch_scale_loss(h_BxTxD, cfg.norm_kind, cfg.eps)


def removal_steps(model_cfg: ModelConfig, fakeln: ml_collections.ConfigDict) -> dict[param_paths.Path, int]:
  """The step at which each norm is replaced: MLP norms of blocks 0…L−1 from `start`, `gap_mlp` apart, then the
  attention norms `gap_attn` apart, then the final norm `gap_final` after the last attention norm."""
  sites = param_paths.norm_sites(model_cfg)
  mlp = [s.norm for s in sites if s.norm[-1] == param_paths.MLP_NORM]
  attn = [s.norm for s in sites if s.norm[-1] == param_paths.ATTN_NORM]
  steps = {norm: fakeln.start + i * fakeln.gap_mlp for i, norm in enumerate(mlp)}
  attn_start = fakeln.start + len(mlp) * fakeln.gap_mlp
  steps.update({norm: attn_start + i * fakeln.gap_attn for i, norm in enumerate(attn)})
  steps[(param_paths.FINAL_NORM,)] = attn_start + (len(attn) - 1) * fakeln.gap_attn + fakeln.gap_final
  return steps


def tree_select(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Leafwise `where` with a scalar predicate."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def select_per_norm(preds: dict[param_paths.Path, jax.Array], on_true: PyTree, on_false: PyTree) -> PyTree:
  """Entries under each norm path from `on_true` where that norm's predicate holds, else from `on_false`."""
  flat_true, flat_false = traverse_util.flatten_dict(on_true), traverse_util.flatten_dict(on_false)
  out = {}
  for key, old in flat_false.items():
    pred = next((p for norm, p in preds.items() if key[:len(norm)] == norm), None)
    out[key] = old if pred is None else jnp.where(pred, flat_true[key], old)
  return traverse_util.unflatten_dict(out)


def build(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig, phases: schedules.Phases) -> TaperNorm | FakeLN:
  """The method `cfg.method` names."""
  method = cfg.get("method", "taper")
  if method not in METHODS:
    raise ValueError(f"method={method!r}: choose one of {METHODS}")
  return {"taper": TaperNorm, "fakeln": FakeLN}[method](cfg, model_cfg, phases)
