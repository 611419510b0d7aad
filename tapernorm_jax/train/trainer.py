"""The train state and the jitted warmup → calibrate → taper step, evaluation and diagnostics.

One compiled step serves the whole run up to the taper end: the gate (`schedules.gate`), the
calibration at the taper start (`calibration.calibrate`) and the scale loss's λ
(`method.scale_loss_terms`) are all functions of the traced step (docs/method.md §3–§5). Once the
gate has reached 0 the loop moves to a second compiled step whose tapered norms are in their
`fixed` form (the same variables), so the normalized branch is no longer computed (§11).

The mesh decides the target: the model is compiled for its devices' platform (`ModelConfig.for_devices`), so
a trainer built over a TPU topology on a CPU host holds exactly the TPU programs, and the activations keep
their batch split over the mesh (`Transformer(mesh=...)`).
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import traverse_util
from jax.sharding import Mesh

from tapernorm_jax.cpu_kernels import autotune
from tapernorm_jax.hf import pretrained
from tapernorm_jax.model import ModelConfig, Transformer, layer_scan, param_paths, sharding
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.model.norms import CALIB, CALIB_STATS
from tapernorm_jax.taper import calibration, losses, methods, schedules
from tapernorm_jax.train import run_config, state_layout
from tapernorm_jax.train import kernel_choice
from tapernorm_jax.train.kernel_choice import Paths

PyTree = Any
State = dict[str, Any]  # {"params", "opt_state", "calib", "step"}


def make_optimizer(cfg: ml_collections.ConfigDict, lr: optax.Schedule) -> optax.GradientTransformation:
  """AdamW with global-norm clipping; weight decay (if any) only on matrices, never on gains or scalars."""
  is_matrix = lambda path, p: layer_scan.layer_ndim(path, p) >= 2  # a layer's own axes, in a stacked tree too
  decay_mask = lambda params: jax.tree_util.tree_map_with_path(is_matrix, params)
  return optax.chain(
    optax.clip_by_global_norm(cfg.opt.clip),
    optax.adamw(lr, b1=cfg.opt.b1, b2=cfg.opt.b2, eps=cfg.opt.eps, weight_decay=cfg.opt.weight_decay, mask=decay_mask),
  )


def grad_norms_by_type(grads: PyTree, model_cfg: ModelConfig) -> dict[str, jax.Array]:
  """Gradient norm per weight type (QKV, attention out, MLP in, MLP out): per block, then averaged over blocks (of
  the per-layer tree, or of the stacked one a scanned step differentiates)."""
  flat = traverse_util.flatten_dict(grads)
  stacked = layer_scan.STACKED in grads

  def squares(paths: tuple) -> jax.Array:  # one block's squared norm; (L,), one per block, in the stacked tree
    paths = [(layer_scan.STACKED, *path[1:]) for path in paths] if stacked else paths
    layer_axes = lambda x: tuple(range(stacked, x.ndim))
    return sum(jnp.sum(jnp.square(flat[p].astype(jnp.float32)), axis=layer_axes(flat[p])) for p in paths)

  per_block = lambda blocks: squares(blocks[0]) if stacked else jnp.stack([squares(paths) for paths in blocks])
  return {
    f"grad_norm/{name}": jnp.mean(jnp.sqrt(per_block(blocks)))
    for name, blocks in param_paths.weight_paths(model_cfg).items()
  }


@dataclasses.dataclass
class Trainer:
  """Everything static about a run: model configs, optimiser, phases, mesh, shardings and compiled steps."""

  cfg: ml_collections.ConfigDict
  mesh: Mesh
  cpu_paths: str | None = None  # overrides train.cpu_paths: auto, xla, kernels, ... (kernel_choice.py)

  def __post_init__(self):
    cfg = self.cfg
    run_config.validate(cfg, self.mesh.size)
    self.model_cfg = ModelConfig.from_config(cfg.model).for_devices(self.mesh)
    self.fixed_cfg = self.model_cfg.fixed_form()
    self.has_fixed_step = bool(cfg.train.fixed_step) and self.fixed_cfg != self.model_cfg
    self.calibrated_norms = param_paths.norms_in(self.model_cfg)
    self.phases = schedules.Phases.from_config(cfg)
    self.method = methods.build(cfg, self.model_cfg, self.phases)
    self.lr = schedules.learning_rate(cfg.opt.lr, self.phases)
    self.tx = make_optimizer(cfg, self.lr)
    boxed = jax.eval_shape(self._boxed_state, jax.random.key(0))
    self.layer_shardings = sharding.shardings(boxed, self.mesh)  # of the state with its blocks per layer
    self.state_shardings = state_layout.placement(self.layer_shardings, self.model_cfg.L, self.model_cfg.scanned)
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    # the target's products and attention (candidates beyond the model's own for CPU only): nothing is timed until
    # `choose_paths` is asked
    self.paths_choice, (self.projection, self.attend) = self._paths(timed=False)
    self._jit_steps()

  def choose_paths(self) -> autotune.Choice:
    """Times the CPU paths at this run's shape where `train.cpu_paths=auto` has no cached choice (kernel_choice.py), and
    trains through the chosen from now on; what a run does once it holds its directory. Returns the choice."""
    self.paths_choice, (self.projection, self.attend) = self._paths(timed=True)
    self._jit_steps()  # the steps trace the paths they are built with
    return self.paths_choice

  def _paths(self, timed: bool) -> tuple[autotune.Choice, Paths]:
    """`kernel_choice.choose` for this trainer: its requested paths, its shape, its compiled step as the timed
    candidate."""
    cfg, B = self.model_cfg, self.cfg.train.batch_size
    shape = {
      "model": cfg.program_key(),
      "method": self.method.__class__.__name__,
      "B": B,
      "microbatches": self.cfg.train.microbatches,
      "mesh": dict(self.mesh.shape),
    }
    label = f"{self.cfg.get('size', '?')} {self.cfg.get('variant', '?')} {B}×{cfg.T}"
    forced = self.cpu_paths if self.cpu_paths is not None else self.cfg.train.get("cpu_paths", "auto")
    return kernel_choice.choose(cfg, self.mesh, forced, shape, label, self._timed_step if timed else None)

  def _timed_step(self, candidate: Paths) -> autotune.Run:
    """One train step through `candidate` (forward, backward, optimiser) on a fresh state mid-taper and a random
    batch, compiled; the state is not updated, so every call does the same work."""
    state, batch_BxT1 = self._timing_inputs
    step = (
      jax.jit(
        lambda s, b: self._train_step(s, b, False, candidate), in_shardings=(self.state_shardings, self.batch_sharding)
      )
      .lower(state, batch_BxT1)
      .compile()
    )
    return lambda: jax.block_until_ready(step(state, batch_BxT1))

  @functools.cached_property
  def _timing_inputs(self) -> tuple[State, jax.Array]:
    """A fresh state in the middle of the taper (0 < g < 1) and a random B × (T + 1) batch (made once)."""
    state = self.init_state(0)
    mid = (self.phases.taper_start + self.phases.taper_end) // 2
    state["step"] = jax.device_put(np.int32(mid), state["step"].sharding)
    batch_BxT1 = np.random.default_rng(0).integers(
      0, self.model_cfg.V, (self.cfg.train.batch_size, self.model_cfg.T + 1), dtype=np.int32
    )
    return state, jax.device_put(batch_BxT1, self.batch_sharding)

  def _jit_steps(self) -> None:
    """The jitted train, eval and diagnostics steps through the chosen paths."""
    replicated = sharding.replicated(self.mesh)
    step = lambda fixed: jax.jit(
      lambda s, b: self._train_step(s, b, fixed),
      in_shardings=(self.state_shardings, self.batch_sharding),
      out_shardings=(self.state_shardings, replicated),
      donate_argnums=0,
    )
    self.train_step, self.fixed_train_step = step(False), step(True)
    self.eval_step = jax.jit(
      self._eval_step, in_shardings=(self.state_shardings, self.batch_sharding), out_shardings=replicated
    )
    self.eval_gated_step = jax.jit(
      self._eval_gated_step, in_shardings=(self.state_shardings, self.batch_sharding), out_shardings=replicated
    )
    self.diagnostics = jax.jit(
      self._diagnostics, in_shardings=(self.state_shardings, self.batch_sharding), out_shardings=replicated
    )

  def _boxed_state(self, rng: jax.Array) -> State:
    """A fresh state with parameters still boxed (for the logical sharding specs)."""
    variables = Transformer(self.model_cfg).init(rng, jnp.zeros((1, min(8, self.model_cfg.T)), jnp.int32))
    params = variables["params"]
    return {
      "params": params,
      "opt_state": self.tx.init(params),
      "calib": variables[CALIB],
      "step": jnp.zeros((), jnp.int32),
    }

  def init_state(self, seed: int) -> State:
    """A fresh, sharded state."""
    fn = jax.jit(lambda rng: self.in_state_layout(nn.unbox(self._boxed_state(rng))), out_shardings=self.state_shardings)
    return fn(jax.random.key(seed))

  def in_state_layout(self, state: State) -> State:
    """A state with its blocks per layer in the layout this run keeps: stacked when the blocks are scanned
    (`state_layout.py`)."""
    return state_layout.convert(state, self.model_cfg.L, self.model_cfg.scanned)

  def per_layer(self, state: State) -> State:
    """`state` with its blocks per layer (`block_0` … `block_{L−1}`), what the fold, exports and decoding read."""
    return state_layout.convert(state, self.model_cfg.L, False)

  def state_from_params(self, params: PyTree) -> State:
    """A fresh, sharded state whose parameters come from a model with plain norms (a pretrained checkpoint): each
    tapered norm starts with γ̃ = γ, calibration state and optimiser at their initial values."""
    fresh = self.per_layer(jax.device_get(self.init_state(0)))
    params = pretrained.merge(fresh["params"], params)
    state = self.in_state_layout({**fresh, "params": params, "opt_state": self.tx.init(params)})
    return jax.device_put(state, self.state_shardings)

  def abstract_state(self, per_layer: bool = False) -> State:
    """Shapes, dtypes and shardings of the state (the restore target), or of its `per_layer` form."""
    shapes = jax.eval_shape(lambda rng: nn.unbox(self._boxed_state(rng)), jax.random.key(0))
    if not per_layer:
      shapes = jax.eval_shape(self.in_state_layout, shapes)
    placement = self.layer_shardings if per_layer else self.state_shardings
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, placement)

  def model(self, model_cfg: ModelConfig, candidate: Paths | None = None) -> Transformer:
    """The model the steps apply: `model_cfg` with the chosen projection and attention (or a `candidate` pair being
    timed, `kernel_choice.py`), its activations split over the mesh."""
    projection, attend = candidate or (self.projection, self.attend)
    return Transformer(model_cfg, projection=projection, attend=attend, mesh=self.mesh)

  def uses_fixed_step(self, step: int) -> bool:
    """True once every gate is 0 for good and the g = 0 step can replace the gated one."""
    return self.has_fixed_step and step >= self.method.off_step

  def _loss(
    self,
    params: PyTree,
    calib: PyTree,
    batch_BxT1: jax.Array,
    gates: Gates | jax.Array,
    step: jax.Array,
    model_cfg: ModelConfig,
    record: bool,
    candidate: Paths | None = None,
  ) -> tuple[jax.Array, tuple]:
    """CE + λ·(scale loss) on a batch of windows; returns (loss, (ce, scale loss, this batch's calib stats))."""
    inputs_BxT, targets_BxT = batch_BxT1[:, :-1], batch_BxT1[:, 1:]
    (logits_BxTxV, h_BxTxD), mutated = self.model(model_cfg, candidate).apply(
      {"params": params, CALIB: calib}, inputs_BxT, gates, return_hidden=True, mutable=[CALIB_STATS] if record else []
    )
    ce = losses.cross_entropy(logits_BxTxV, targets_BxT)
    weight, scale_loss = self.method.scale_loss_terms(h_BxTxD, calib, step, inputs_BxT)
    return ce + weight * scale_loss, (ce, scale_loss, mutated.get(CALIB_STATS, {}))

  def _grads(
    self,
    params: PyTree,
    calib: PyTree,
    batch_BxT1: jax.Array,
    gates: Gates | jax.Array,
    step: jax.Array,
    model_cfg: ModelConfig,
    record: bool,
    candidate: Paths | None = None,
  ) -> tuple[tuple, PyTree]:
    """((loss, (ce, scale loss, stats)), grads), accumulated over `train.microbatches` microbatches: row j of every
    group of k rows goes to microbatch j, so each device keeps its rows; every output is the mean over microbatches."""
    loss_fn = lambda p, batch: self._loss(p, calib, batch, gates, step, model_cfg, record, candidate)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    compute = self.compute_copy(params, model_cfg)  # differentiated in its own dtype; grads summed in the params'
    as_params = lambda out: (out[0], jax.tree.map(lambda g, p: g.astype(p.dtype), out[1], params))
    if self.cfg.train.microbatches == 1:
      return as_params(grad_fn(compute, batch_BxT1))
    micro_KxMxT1 = self.microbatches(batch_BxT1)
    k = micro_KxMxT1.shape[0]

    def add(total, micro_MxT1):
      return jax.tree.map(jnp.add, total, as_params(grad_fn(compute, micro_MxT1))), None

    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda b: as_params(grad_fn(compute, b)), micro_KxMxT1[0]))
    total, _ = jax.lax.scan(add, zeros, micro_KxMxT1)
    return jax.tree.map(lambda x: x / k, total)

  def compute_copy(self, params: PyTree, model_cfg: ModelConfig) -> PyTree:
    """The weights (every parameter of two or more axes) cast to the compute dtype where they lie, so what FSDP
    gathers, and the gradients it sums, are in the compute dtype whatever the compiler does (`mesh.gather_dtype=
    compute`; XLA's TPU compiler already moves the cast before the gather: docs/tpu.md); `param`, or a compute dtype
    that is the parameters' own, leaves them as they are and the model casts where it uses them."""
    if self.cfg.mesh.get("gather_dtype", "compute") == "param":
      return params
    dtype = jnp.dtype(model_cfg.compute_dtype)
    placement = self.state_shardings["params"]
    cast = lambda path, p, s: (
      jax.lax.with_sharding_constraint(p.astype(dtype), s)
      if layer_scan.layer_ndim(path, p) >= 2 and p.dtype != dtype
      else p
    )
    return jax.tree_util.tree_map_with_path(cast, params, placement)

  def microbatches(self, batch_BxT1: jax.Array) -> jax.Array:
    """The batch as `train.microbatches` microbatches, k × (B/k) × (T+1): row j of every k rows goes to microbatch j,
    so each device keeps its own rows."""
    k = self.cfg.train.microbatches
    B, T1 = batch_BxT1.shape
    return jnp.swapaxes(batch_BxT1.reshape(B // k, k, T1), 0, 1)

  def _train_step(
    self, state: State, batch_BxT1: jax.Array, fixed: bool, candidate: Paths | None = None
  ) -> tuple[State, dict]:
    """One optimiser step; the method sets the gates, calibrates at its events and decides which EMAs still run
    (through a `candidate` pair of paths while they are timed, `kernel_choice.py`)."""
    step, params, calib, opt_state = state["step"], state["params"], state["calib"], state["opt_state"]
    gates = Gates.uniform(0.0, self.model_cfg.L) if fixed else self.method.gates(step)
    if not fixed:
      params, calib = self.calibrate(params, calib, step)
    model_cfg = self.fixed_cfg if fixed else self.model_cfg
    (loss, (ce, scale_loss, stats)), grads = self._grads(
      params, calib, batch_BxT1, gates, step, model_cfg, not fixed, candidate
    )
    if not fixed:
      calib = calibration.ema_update(calib, stats, self.method.mu, active=self.method.stats_active(step))
    updates, opt_state = self.tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    new_state = {
      "params": params,
      "opt_state": opt_state,
      "calib": calib,
      "step": step + 1,
    }
    metrics = {
      "loss": loss,
      "ce": ce,
      "scale_loss": scale_loss,
      "gate": gates.mean(),
      "lr": self.lr(step),
      "grad_norm": optax.tree.norm(grads),
      **grad_norms_by_type(grads, self.model_cfg),
    }
    return new_state, metrics

  def calibrate(self, params: PyTree, calib: PyTree, step: jax.Array) -> tuple[PyTree, PyTree]:
    """The method's calibration at `step`; on stacked parameters it sees each block's norms as that block's own."""
    if layer_scan.STACKED not in params:
      return self.method.calibrate(params, calib, step)
    names = {site.norm[1] for site in param_paths.norm_sites(self.model_cfg) if site.norm[0] == param_paths.block(0)}
    return layer_scan.with_blocks_unstacked(self.method.calibrate, params, names, calib, step)

  def _eval_step(self, state: State, batch_BxT1: jax.Array) -> jax.Array:
    """Cross-entropy at g = 0 (the paper evaluates every TaperNorm model there), one microbatch at a time."""
    ce_of = lambda micro_MxT1: self._loss(
      state["params"], state["calib"], micro_MxT1, jnp.float32(0.0), state["step"], self.fixed_cfg, False
    )[1][0]
    return jnp.mean(jax.lax.map(ce_of, self.microbatches(batch_BxT1)))

  def _eval_gated_step(self, state: State, batch_BxT1: jax.Array) -> jax.Array:
    """Cross-entropy at the gates of the state's step (before they reach 0), one microbatch at a time."""
    gates = self.method.gates(state["step"])
    ce_of = lambda micro_MxT1: self._loss(
      state["params"], state["calib"], micro_MxT1, gates, state["step"], self.model_cfg, False
    )[1][0]
    return jnp.mean(jax.lax.map(ce_of, self.microbatches(batch_BxT1)))

  def eval_gate(self, step: int) -> float:
    """The mean gate a validation at `step` is taken at: 0 once every gate is 0 for good (the g = 0 model), before
    that the gates the model trains at (a g = 0 loss then reads a calibration the model has moved past)."""
    return 0.0 if step >= self.method.off_step else float(self.method.gates(jnp.asarray(step)).mean())

  def _diagnostics(self, state: State, batch_BxT1: jax.Array) -> dict[str, jax.Array]:
    """Scale-anchoring diagnostics at the current gates: logit norm, s(h), s_tgt, radial gradient at h, each c."""
    step, cfg, calib = state["step"], self.model_cfg, state["calib"]
    batch_BxT1 = self.microbatches(batch_BxT1)[0]  # one microbatch: what fits in memory
    gates = self.method.gates(step)
    variables = {"params": state["params"], CALIB: calib}
    model = self.model(cfg)
    inputs_BxT, targets_BxT = batch_BxT1[:, :-1], batch_BxT1[:, 1:]
    h_BxTxD = model.apply(variables, inputs_BxT, gates, method=Transformer.hidden)

    def summed_token_losses(h_BxTxD):
      logits_BxTxV = model.apply(variables, h_BxTxD, gates, method=Transformer.logits)
      ce_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets_BxT)
      weight, scale_loss = self.method.scale_loss_terms(h_BxTxD, calib, step, inputs_BxT)  # a mean over tokens
      return jnp.sum(ce_BxT) + ce_BxT.size * weight * scale_loss, logits_BxTxV

    grad_BxTxD, logits_BxTxV = jax.grad(summed_token_losses, has_aux=True)(h_BxTxD)
    return {
      "logit_norm": losses.logit_norm(logits_BxTxV),
      "s_mean": jnp.mean(losses.pre_logit_scale(h_BxTxD, cfg.norm_kind, cfg.eps)),
      "s_tgt": calibration.s_target(calib),
      "radial_grad": losses.radial_gradient(grad_BxTxD, h_BxTxD),
      **{f"c/{k}": v for k, v in calibration.norm_scalars(calib, self.calibrated_norms, param_paths.C).items()},
    }
