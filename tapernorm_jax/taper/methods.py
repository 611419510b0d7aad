"""How norms are removed during training: TaperNorm, FakeLN and PRepBN as answers to the same four questions.

    gates(step)                 which gate each norm gets (`model.gates.Gates`, one field per norm position)
    calibrate(params, calib, step)   when and how each norm's fixed map (c, γ̃) is set
    stats_active(step)          which calibration EMAs still run
    scale_loss_terms(h, calib, step, tokens)  the anchoring loss added to cross-entropy: (its λ now, unweighted value)

Both run every removable norm in the `taper` form, so they share the model, the calibration
state, the `fixed` g = 0 form and the fold: a frozen FakeLN, ((x − μ_x)/σ_avg)·γ + β, is TaperLN
at g = 0 with c = 1/σ_avg and γ̃ = γ (docs/method.md §10). They differ in timing: TaperNorm moves
one global gate along a half-cosine after calibrating every norm at once; FakeLN switches each
norm's gate from 1 to 0 at its own step, calibrating it there (an attention norm in two stages:
its query/key path, then its value path). Every decision is a function of the traced step, so
neither recompiles when a gate changes. PRepBN (Guo et al., 2024) runs its norms in the `repbn` form instead:
one global gate λ, 1 for a warm-up, then linear to 0, blends each norm into RepBN(h) = BN(h) + η·h, whose running
statistics are its EMAs (the BatchNorm momentum as μ) and which folds like a tapered norm (docs/method.md §15).
"""

import dataclasses
import logging
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
METHODS = ("taper", "fakeln", "prepbn")
DEFAULT = "taper"  # configs without a `method` field (written before FakeLN) are TaperNorm runs
TAPER_DEFAULTS = dict(  # the `taper` section
    gate_warmup_frac=0.05,  # gate = 1 (and calibration EMAs run) for this share of the steps
    taper_end=-1,  # step at which the gate reaches 0; -1 = the last step
    mu=0.01,  # EMA weight of the calibration statistics
    delta=1e-8,  # c* = num / (den + δ)
    scale_loss_weight=0.1)  # λ of the fixed-target scale loss, on from the taper start (0: off)
FAKELN_DEFAULTS = dict(  # the `fakeln` section (method=fakeln: one norm replaced at a time, docs/method.md §10)
    start=20,  # the step the first MLP norm is replaced at
    gap_mlp=2, gap_attn=2,  # steps between consecutive MLP-norm / attention-norm (query/key path) removals
    gap_attn_v=3,  # steps between consecutive value-path removals, which start after the last query/key one
    gap_final=3,  # steps from the last value-path removal to the final norm
    mu=0.01,  # EMA weight of each norm's σ statistics (positions 1…T−1)
    sigma_steps=0,  # σ from the first this many steps only (1: the starting model's σ); 0: until each removal
    scale_loss_weight=0.1,  # λ of mean((s(h) − s̄)²), s̄ the batch mean of s(h) over ordinary tokens; from step 0
    eot_id=-1)  # the end-of-text token id, which s̄ leaves out with position 0 (-1: none)
# The `prepbn` section (method=prepbn, docs/method.md §15). The authors' LLaMA code (xinghaochen/SLAB, llama/modeling/
# llama-350M/modeling_llama.py) warms up for 10,000 steps with the norm alone, then takes λ from 1 to 0 linearly over
# 18,000; as shares of a run: the warm-up 10/28 of it, λ = 0 at its last step.
PREPBN_DEFAULTS = dict(
    warm_frac=0.36,  # λ = 1 (the norm alone) for this share of the steps; BatchNorm's statistics start after it
    blend_end=-1,  # the step λ reaches 0 at, linearly from the warm-up's end; -1 = the last step
    momentum=0.1,  # BatchNorm's running-statistics momentum (PyTorch's default, which the authors keep)
    scale_loss_weight=0.0)  # weight of FakeLN's batch scale loss; PRepBN has none (> 0: a +aux control)


def name(cfg: ml_collections.ConfigDict) -> str:
  """The method `cfg.method` names (TaperNorm where the field is absent); ValueError for an unknown one."""
  method = cfg.get("method", DEFAULT)
  if method not in METHODS:
    raise ValueError(f"method={method!r}: choose one of {METHODS}")
  return method


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
    config_fields.check(cfg, [
        (0.0 < cfg.taper.mu <= 1.0, "taper.mu", "the EMA weight μ must lie in (0, 1]"),
        (cfg.taper.scale_loss_weight >= 0, "taper.scale_loss_weight", "λ must be >= 0 (0 turns the scale loss off)"),
        (cfg.taper.delta >= 0, "taper.delta", "must be >= 0")])
    if "taper" in (model_cfg.internal_norm, model_cfg.final_norm) and phases.taper_start < 1:
      raise ValueError(f"taper.gate_warmup_frac={cfg.taper.gate_warmup_frac} gives no warmup step; calibration "
                       "needs at least one (raise it or train.steps)")
    if model_cfg.final_norm in ("taper", "fixed", "identity") and cfg.taper.scale_loss_weight == 0:
      logging.warning("final_norm=%r with taper.scale_loss_weight=0: nothing anchors the pre-logit scale, so logits "
                      "may grow without bound (logit chasing). A legitimate ablation; set taper.scale_loss_weight>0 "
                      "to anchor.", model_cfg.final_norm)

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

  def scale_loss_terms(self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array,
                       tokens_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """λ (from the taper start on) and the fixed-target scale loss mean((s(h) − s_tgt)²)."""
    del tokens_BxT
    weight = jnp.where(step >= self.phases.taper_start, self.cfg.taper.scale_loss_weight, 0.0)
    cfg = self.model_cfg
    return weight, losses.scale_loss(h_BxTxD, calibration.s_target(calib), cfg.norm_kind, cfg.eps)


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
    config_fields.check(cfg, [
        (cfg.fakeln.start >= 1, "fakeln.start",
         "must be >= 1 (σ_avg needs at least one step of statistics before the first removal)"),
        *[(cfg.fakeln[f] >= 0, f"fakeln.{f}", "must be >= 0")
          for f in ("gap_mlp", "gap_attn", "gap_attn_v", "gap_final")],
        (0.0 < cfg.fakeln.mu <= 1.0, "fakeln.mu", "the EMA weight μ must lie in (0, 1]"),
        (cfg.fakeln.sigma_steps >= 0, "fakeln.sigma_steps",
         "must be >= 0 (0: σ until each norm's removal; N: from the first N steps)"),
        (cfg.fakeln.scale_loss_weight >= 0, "fakeln.scale_loss_weight",
         "λ must be >= 0 (0 turns the scale loss off)"),
        (-1 <= cfg.fakeln.eot_id < model_cfg.V, "fakeln.eot_id",
         f"must be a token id below model.V={model_cfg.V}, or -1 (no end-of-text token)")])
    last = max(removal_steps(model_cfg, cfg.fakeln)[0].values())
    if last >= cfg.train.steps:
      raise ValueError(f"fakeln removes its last norm at step {last}, not before train.steps={cfg.train.steps}; "
                       "lower fakeln.start or the gaps, or raise train.steps")

  def gates(self, step: jax.Array) -> Gates:
    """Each norm's gate, and each attention norm's value path's: 1 before its removal step, 0 from it on."""
    on = lambda at: jnp.where(step >= at, 0.0, 1.0).astype(jnp.float32)
    blocks = lambda removal, name: jnp.stack([on(removal[(param_paths.block(i), name)])
                                              for i in range(self.model_cfg.L)])
    return Gates(attn=blocks(self.removal, param_paths.ATTN_NORM), mlp=blocks(self.removal, param_paths.MLP_NORM),
                 final=on(self.removal[(param_paths.FINAL_NORM,)]),
                 attn_value=blocks(self.value_removal, param_paths.ATTN_NORM))

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

  def scale_loss_terms(self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array,
                       tokens_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """λ (from step 0) and mean((s(h) − s̄)²) over every token, s̄ the batch mean over the tokens neither at position
    0 nor end-of-text, held constant."""
    del calib, step
    ordinary_BxT = (jnp.arange(tokens_BxT.shape[1]) > 0)[None, :] & (tokens_BxT != self.cfg.fakeln.eot_id)
    cfg = self.model_cfg
    return jnp.float32(self.cfg.fakeln.scale_loss_weight), losses.batch_scale_loss(h_BxTxD, cfg.norm_kind, cfg.eps,
                                                                            ordinary_BxT)


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
    config_fields.check(cfg, [
        ("repbn" in (model_cfg.internal_norm, model_cfg.final_norm), "model.internal_norm",
         "method=prepbn blends norms into RepBN: set model.internal_norm and/or model.final_norm to 'repbn' "
         "(the prepbn variant does)"),
        (0.0 <= cfg.prepbn.warm_frac < 1.0, "prepbn.warm_frac", "must lie in [0, 1): the warm-up ends before the run"),
        (warm_end < off_step < cfg.train.steps, "prepbn.blend_end",
         f"λ must reach 0 after the warm-up ends (step {warm_end}) and before train.steps={cfg.train.steps}; "
         "-1 is the last step"),
        (0.0 < cfg.prepbn.momentum <= 1.0, "prepbn.momentum", "BatchNorm's momentum must lie in (0, 1]"),
        (cfg.prepbn.scale_loss_weight >= 0, "prepbn.scale_loss_weight", "must be >= 0 (0 turns the scale loss off)")])

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

  def scale_loss_terms(self, h_BxTxD: jax.Array, calib: PyTree, step: jax.Array,
                       tokens_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`prepbn.scale_loss_weight` (0 as published) and FakeLN's mean((s(h) − s̄)²), position 0 left out of s̄."""
    del calib, step
    ordinary_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]) > 0, tokens_BxT.shape)
    cfg = self.model_cfg
    return jnp.float32(self.cfg.prepbn.scale_loss_weight), losses.batch_scale_loss(h_BxTxD, cfg.norm_kind, cfg.eps,
                                                                                 ordinary_BxT)


def prepbn_steps(cfg: ml_collections.ConfigDict) -> tuple[int, int]:
  """(the warm-up's end, the step λ reaches 0) of a PRepBN run."""
  steps = cfg.train.steps
  return int(round(cfg.prepbn.warm_frac * steps)), steps - 1 if cfg.prepbn.blend_end == -1 else cfg.prepbn.blend_end


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


CLASSES = {"taper": TaperNorm, "fakeln": FakeLN, "prepbn": PRepBN}


def validate(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig, phases: schedules.Phases) -> None:
  """The checks of the method `cfg.method` names (before anything compiles)."""
  method = name(cfg)
  if method != "prepbn" and "repbn" in (model_cfg.internal_norm, model_cfg.final_norm):
    raise ValueError(f"method={method!r} with a 'repbn' norm: only method=prepbn moves RepBN's gate and statistics; "
                     "set method=prepbn (the prepbn variant does) or another norm mode")
  CLASSES[method].check(cfg, model_cfg, phases)


def scale_loss_weight(cfg: ml_collections.ConfigDict) -> float:
  """The λ of the scale loss the run's method adds (`taper.scale_loss_weight` or `fakeln.scale_loss_weight`)."""
  return float(cfg[name(cfg)].scale_loss_weight)


def build(cfg: ml_collections.ConfigDict, model_cfg: ModelConfig,
          phases: schedules.Phases) -> TaperNorm | FakeLN | PRepBN:
  """The method `cfg.method` names."""
  return CLASSES[name(cfg)](cfg, model_cfg, phases)
