"""The train state and the jitted warmup → calibrate → taper step, evaluation and diagnostics.

One compiled step serves the whole run up to the taper end: the gate (`schedules.gate`), the
calibration at the taper start (`calibration.calibrate`) and the aux-loss switch
(`Trainer.aux_weight`) are all functions of the traced step (docs/method.md §3–§5). Once the
gate has reached 0 the loop moves to a second compiled step whose tapered norms are in their
`fixed` form (the same variables), so the normalized branch is no longer computed (§11).
"""

import dataclasses
import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import traverse_util
from jax.sharding import Mesh

from tapernorm_jax import calibration, layout, losses, schedules, sharding
from tapernorm_jax.model import ModelConfig, Transformer
from tapernorm_jax.norms import CALIB, CALIB_STATS

PyTree = Any
State = dict[str, Any]  # {"params", "opt_state", "calib", "step"}


def validate(cfg: ml_collections.ConfigDict, num_devices: int) -> None:
  """Raises ValueError naming the offending field for configs that cannot train; runs before compiling."""
  model_cfg = ModelConfig.from_config(cfg.model)
  phases = schedules.Phases.from_config(cfg) if cfg.train.steps > 0 else None
  gated = "taper" in (model_cfg.internal_norm, model_cfg.final_norm)  # some norm follows the gate schedule
  checks = [
      (cfg.train.steps > 0, "train.steps", "must be positive"),
      (cfg.train.batch_size > 0, "train.batch_size", "must be positive"),
      (cfg.train.batch_size % num_devices == 0, "train.batch_size",
       f"must be divisible by the data-parallel size ({num_devices} devices); change it or mesh.data/mesh.fsdp"),
      (0.0 <= cfg.opt.warmup_frac <= 1.0, "opt.warmup_frac", "must lie in [0, 1]"),
      (cfg.opt.lr > 0, "opt.lr", "must be positive"),
      (cfg.opt.weight_decay >= 0, "opt.weight_decay", "must be >= 0"),
      (0.0 <= cfg.taper.gate_warmup_frac <= 1.0, "taper.gate_warmup_frac",
       "must lie in [0, 1]: the gate warmup cannot be longer than the run"),
      (0.0 < cfg.taper.mu <= 1.0, "taper.mu", "the EMA weight μ must lie in (0, 1]"),
      (cfg.taper.aux_weight >= 0, "taper.aux_weight", "λ must be >= 0 (0 turns the scale loss off)"),
      (cfg.taper.delta >= 0, "taper.delta", "must be >= 0"),
      (cfg.train.profile_steps >= 0, "train.profile_steps", "must be >= 0 (0 turns profiling off)"),
      (cfg.train.profile_start >= 0, "train.profile_start", "must be >= 0"),
  ]
  for ok, field, problem in checks:
    if not ok:
      section, name = field.split(".")
      raise ValueError(f"{field}={cfg[section][name]!r}: {problem}")
  if cfg.taper.taper_end != -1 and not 0 < cfg.taper.taper_end <= cfg.train.steps:
    raise ValueError(f"taper.taper_end={cfg.taper.taper_end}: must be -1 (the last step) or in "
                     f"(0, train.steps={cfg.train.steps}]")
  if phases.taper_start > phases.taper_end:
    raise ValueError(f"taper.gate_warmup_frac={cfg.taper.gate_warmup_frac}: the taper would start at step "
                     f"{phases.taper_start}, after taper.taper_end={phases.taper_end}")
  if gated and phases.taper_start < 1:
    raise ValueError(f"taper.gate_warmup_frac={cfg.taper.gate_warmup_frac} gives no warmup step; calibration "
                     "needs at least one (raise it or train.steps)")
  if model_cfg.final_norm != "plain" and cfg.taper.aux_weight == 0:
    logging.warning("final_norm=%r with taper.aux_weight=0: nothing anchors the pre-logit scale, so logits may "
                    "grow without bound (logit chasing). A legitimate ablation; set taper.aux_weight>0 to anchor.",
                    model_cfg.final_norm)


def make_optimizer(cfg: ml_collections.ConfigDict, lr: optax.Schedule) -> optax.GradientTransformation:
  """AdamW with global-norm clipping; weight decay (if any) only on matrices, never on gains or scalars."""
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  return optax.chain(
      optax.clip_by_global_norm(cfg.opt.clip),
      optax.adamw(lr, b1=cfg.opt.b1, b2=cfg.opt.b2, eps=cfg.opt.eps, weight_decay=cfg.opt.weight_decay,
                  mask=decay_mask))


def tree_select(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Leafwise `where` with a scalar predicate."""
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def grad_norms_by_type(grads: PyTree, model_cfg: ModelConfig) -> dict[str, jax.Array]:
  """Gradient norm per weight type (QKV, attention out, MLP in, MLP out): per block, then averaged over blocks."""
  flat = traverse_util.flatten_dict(grads)
  sq = lambda paths: sum(jnp.sum(jnp.square(flat[p].astype(jnp.float32))) for p in paths)
  return {f"grad_norm/{name}": jnp.mean(jnp.sqrt(jnp.stack([sq(paths) for paths in per_block])))
          for name, per_block in layout.weight_paths(model_cfg).items()}


@dataclasses.dataclass
class Trainer:
  """Everything static about a run: model configs, optimiser, phases, mesh, shardings and compiled steps."""

  cfg: ml_collections.ConfigDict
  mesh: Mesh

  def __post_init__(self):
    cfg = self.cfg
    validate(cfg, self.mesh.size)
    self.model_cfg = ModelConfig.from_config(cfg.model)
    self.fast_cfg = self.model_cfg.fixed_form()
    self.has_fast_path = bool(cfg.taper.fast_path) and self.fast_cfg != self.model_cfg
    self.calibrated_norms = layout.norms_in(self.model_cfg)
    self.gated_norms = layout.norms_in(self.model_cfg, ("taper",))  # these record statistics and get calibrated
    self.phases = schedules.Phases.from_config(cfg)
    self.lr = schedules.learning_rate(cfg.opt.lr, self.phases)
    self.tx = make_optimizer(cfg, self.lr)
    boxed = jax.eval_shape(self._boxed_state, jax.random.key(0))
    self.state_shardings = sharding.shardings(boxed, self.mesh)
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    replicated = sharding.replicated(self.mesh)
    step = lambda fast: jax.jit(lambda s, b: self._train_step(s, b, fast),
                                in_shardings=(self.state_shardings, self.batch_sharding),
                                out_shardings=(self.state_shardings, replicated), donate_argnums=0)
    self.train_step, self.fast_train_step = step(False), step(True)
    self.eval_step = jax.jit(self._eval_step, in_shardings=(self.state_shardings, self.batch_sharding),
                             out_shardings=replicated)
    self.diagnostics = jax.jit(self._diagnostics, in_shardings=(self.state_shardings, self.batch_sharding),
                               out_shardings=replicated)

  def _boxed_state(self, rng: jax.Array) -> State:
    """A fresh state with parameters still boxed (for the logical sharding specs)."""
    variables = Transformer(self.model_cfg).init(rng, jnp.zeros((1, min(8, self.model_cfg.T)), jnp.int32))
    params = variables["params"]
    return {"params": params, "opt_state": self.tx.init(params), "calib": variables[CALIB],
            "step": jnp.zeros((), jnp.int32)}

  def init_state(self, seed: int) -> State:
    """A fresh, sharded state."""
    fn = jax.jit(lambda rng: nn.unbox(self._boxed_state(rng)), out_shardings=self.state_shardings)
    return fn(jax.random.key(seed))

  def abstract_state(self) -> State:
    """Shapes, dtypes and shardings of the state (the restore target)."""
    shapes = jax.eval_shape(lambda rng: nn.unbox(self._boxed_state(rng)), jax.random.key(0))
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                        self.state_shardings)

  def aux_weight(self, step: jax.Array) -> jax.Array:
    """λ from the taper start on (when s_tgt exists), 0 before."""
    return jnp.where(step >= self.phases.taper_start, self.cfg.taper.aux_weight, 0.0)

  def uses_fast_step(self, step: int) -> bool:
    """True once the gate is 0 for good and the g = 0 step can replace the tapered one."""
    return self.has_fast_path and step >= self.phases.taper_end

  def _loss(self, params: PyTree, calib: PyTree, batch_BxT1: jax.Array, gate: jax.Array, aux_weight: jax.Array,
            model_cfg: ModelConfig, record: bool) -> tuple[jax.Array, tuple]:
    """CE + λ·L_aux on a batch of windows; returns (loss, (ce, aux, this batch's calib stats))."""
    inputs_BxT, targets_BxT = batch_BxT1[:, :-1], batch_BxT1[:, 1:]
    (logits_BxTxV, h_BxTxD), mutated = Transformer(model_cfg).apply(
        {"params": params, CALIB: calib}, inputs_BxT, gate, return_hidden=True, mutable=[CALIB_STATS] if record else [])
    ce = losses.cross_entropy(logits_BxTxV, targets_BxT)
    aux = losses.scale_loss(h_BxTxD, calibration.s_target(calib), model_cfg.norm_kind, model_cfg.eps)
    return ce + aux_weight * aux, (ce, aux, mutated.get(CALIB_STATS, {}))

  def _train_step(self, state: State, batch_BxT1: jax.Array, fast: bool) -> tuple[State, dict]:
    """One optimiser step; calibrates at the taper start and updates EMAs during the warmup."""
    cfg, phases, step = self.cfg, self.phases, state["step"]
    gate = jnp.float32(0.0) if fast else schedules.gate(step, phases)
    params, calib = state["params"], state["calib"]
    if not fast:
      calibrated = calibration.calibrate(params, calib, self.gated_norms, cfg.taper.mu, cfg.taper.delta)
      params, calib = tree_select(step == phases.taper_start, calibrated, (params, calib))
    aux_weight = self.aux_weight(step)
    model_cfg = self.fast_cfg if fast else self.model_cfg
    grad_fn = jax.value_and_grad(self._loss, has_aux=True)
    (loss, (ce, aux, stats)), grads = grad_fn(params, calib, batch_BxT1, gate, aux_weight, model_cfg, not fast)
    if not fast:
      calib = calibration.ema_update(calib, stats, cfg.taper.mu, active=step < phases.taper_start)
    updates, opt_state = self.tx.update(grads, state["opt_state"], params)
    new_state = {"params": optax.apply_updates(params, updates), "opt_state": opt_state, "calib": calib,
                 "step": step + 1}
    metrics = {"loss": loss, "ce": ce, "aux": aux, "gate": gate, "lr": self.lr(step),
               "grad_norm": optax.global_norm(grads), **grad_norms_by_type(grads, self.model_cfg)}
    return new_state, metrics

  def _eval_step(self, state: State, batch_BxT1: jax.Array) -> jax.Array:
    """Cross-entropy at g = 0 (the paper evaluates every TaperNorm model there)."""
    _, (ce, _, _) = self._loss(state["params"], state["calib"], batch_BxT1, jnp.float32(0.0), jnp.float32(0.0),
                               self.fast_cfg, False)
    return ce

  def _diagnostics(self, state: State, batch_BxT1: jax.Array) -> dict[str, jax.Array]:
    """Scale-anchoring diagnostics at the current gate: logit norm, s(h), s_tgt, radial gradient at h."""
    step, cfg = state["step"], self.model_cfg
    gate = schedules.gate(step, self.phases)
    variables = {"params": state["params"], CALIB: state["calib"]}
    model = Transformer(cfg)
    inputs_BxT, targets_BxT = batch_BxT1[:, :-1], batch_BxT1[:, 1:]
    h_BxTxD = model.apply(variables, inputs_BxT, gate, method=Transformer.hidden)
    s_tgt = calibration.s_target(state["calib"])
    aux_weight = self.aux_weight(step)

    def token_losses(h):
      logits = model.apply(variables, h, gate, method=Transformer.logits)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets_BxT)
      s = losses.pre_logit_scale(h, cfg.norm_kind, cfg.eps)
      return jnp.sum(ce + aux_weight * jnp.square(s - s_tgt)), logits

    grad_BxTxD, logits_BxTxV = jax.grad(token_losses, has_aux=True)(h_BxTxD)
    return {"logit_norm": losses.logit_norm(logits_BxTxV),
            "s_mean": jnp.mean(losses.pre_logit_scale(h_BxTxD, cfg.norm_kind, cfg.eps)),
            "s_tgt": s_tgt, "radial_grad": losses.radial_gradient(grad_BxTxD, h_BxTxD),
            **{f"c/{k}": v for k, v in calibration.norm_scalars(state["calib"], self.calibrated_norms, layout.C).items()}}
