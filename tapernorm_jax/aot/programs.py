"""Every program a run executes, ready to lower for a mesh: nothing is initialised, read or run.

    train_step    the one step that carries warmup → calibration → taper (the whole schedule, as on any host)
    fixed_step    the step after the taper, norms in their g = 0 form (variants with tapered norms)
    eval_step     cross-entropy at g = 0 over `train.microbatches` microbatches
    diagnostics   the scale-anchoring diagnostics on one microbatch
    fold          the g = 0 maps folded into the projections (variants with tapered or RepBN norms)
    prefill       `decode_batch` prompts of `prompt_len` tokens into a KV cache of model.T slots
    decode_step   one token per row over that cache
    serve_prefill, serve_decode_step
                  the same two in the serving layout: the folded weights in bfloat16, whole on every chip, or
                  split over `Decoding.tensor` chips per copy (`inference/tensor_parallel.py`)

Each comes with the analytic FLOPs (per chip) the project counts for MFU, 6·N + 12·L·D·T per trained token and a
third of that per forward token, N the parameters a token is multiplied by (lookup tables left out), so the
compiler's count can be read against it. `prefill` and `decode_step` keep the training layout (weights split over
`fsdp`, so each step gathers them); the `serve_` programs are what a server would run, rows split over the mesh and
nothing but rows between chips. A model whose bfloat16 weights do not fit on one chip is served split for tensor
parallelism: heads and MLP units over `Decoding.tensor` chips, one all-reduce of the activation after each
row-split projection, the KV cache split with the heads.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tapernorm_jax.runtime import costs
from tapernorm_jax.inference import decode, tensor_parallel
from tapernorm_jax.model import ModelConfig, abstract_variables, param_count, sharding
from tapernorm_jax.taper import fold as fold_lib
from tapernorm_jax.train.trainer import Trainer

PyTree = Any


@dataclasses.dataclass
class Program:
  """One program: its name, how to lower it, the analytic FLOPs per chip of one call (None where the project counts
  none), and the tokens it processes per call."""

  name: str
  lower: Callable[[], Any]
  analytic_flops: float | None
  tokens: int


@dataclasses.dataclass(frozen=True)
class Decoding:
  """The inference programs' shape: rows decoded at once, the prompt length of a prefill, and the chips that share
  one copy of the served model (1: whole on every chip)."""

  batch: int
  prompt_len: int
  tensor: int = 1


def abstract(shape: tuple[int, ...], dtype: Any, placement: NamedSharding) -> jax.ShapeDtypeStruct:
  """An argument that exists only as its shape, dtype and placement."""
  return jax.ShapeDtypeStruct(shape, dtype, sharding=placement)


def rows_sharding(mesh: Mesh, rows: int) -> NamedSharding:
  """Rows split over every device where they divide, else whole on each."""
  return sharding.batch_sharding(mesh) if rows % sharding.batch_devices(mesh) == 0 else sharding.replicated(mesh)


def training(trainer: Trainer) -> list[Program]:
  """The train step (and the fixed step), evaluation and diagnostics of `trainer`'s run."""
  cfg, model_cfg, devices = trainer.cfg, trainer.model_cfg, trainer.mesh.size
  state = trainer.abstract_state()
  B, T = cfg.train.batch_size, model_cfg.T
  batch = abstract((B, T + 1), jnp.int32, trainer.batch_sharding)
  train_flops = (
    costs.train_flops_per_token(matmul_params(state["params"], model_cfg), model_cfg.L, model_cfg.D, T)
    * B
    * T
    / devices
  )
  programs = [Program("train_step", lambda: trainer.train_step.lower(state, batch), train_flops, B * T)]
  if trainer.has_fixed_step:
    programs.append(Program("fixed_step", lambda: trainer.fixed_train_step.lower(state, batch), train_flops, B * T))
  return programs + [
    Program("eval_step", lambda: trainer.eval_step.lower(state, batch), train_flops / 3, B * T),
    Program("diagnostics", lambda: trainer.diagnostics.lower(state, batch), None, B * T // cfg.train.microbatches),
  ]


def inference(trainer: Trainer, decoding: Decoding) -> list[Program]:
  """The fold (for models whose norms fold), prefill and one decode step on the mesh and layout of `trainer`'s run,
  and the two again in the serving layout."""
  mesh, trained_cfg = trainer.mesh, trainer.model_cfg
  state = trainer.abstract_state(per_layer=True)  # what the fold reads
  trained = {"params": state["params"], "calib": state["calib"]}
  programs, variables, model_cfg = [], trained, trained_cfg
  if trained_cfg.foldable:
    model_cfg = fold_lib.folded_config(trained_cfg)
    placement = sharding.shardings(abstract_variables(model_cfg), mesh)
    fold = jax.jit(functools.partial(fold_variables, model_cfg=trained_cfg), out_shardings=placement)
    programs.append(Program("fold", functools.partial(fold.lower, trained), None, 0))
    variables = jax.tree.map(lambda x, s: abstract(x.shape, x.dtype, s), jax.eval_shape(fold, trained), placement)
  serving_cfg, to_serve = model_cfg.replace(dtype="bfloat16", param_dtype="bfloat16"), variables
  if decoding.tensor > 1:  # the MLP padded where its width does not divide (the training layout's stays as it is)
    split = tensor_parallel.make_mesh(list(mesh.devices.flat), decoding.tensor)
    to_serve = jax.eval_shape(lambda v: tensor_parallel.pad(v, serving_cfg, decoding.tensor)[0], variables)
    serving_cfg = tensor_parallel.padded_config(serving_cfg, decoding.tensor)
    placement = tensor_parallel.variable_shardings(serving_cfg, split)
  else:
    split, placement = None, jax.tree.map(lambda _: sharding.replicated(mesh), variables)
  served = jax.tree.map(lambda x, s: abstract(x.shape, serving_dtype(x.dtype), s), to_serve, placement)
  return (
    programs
    + decoding_programs(variables, model_cfg, mesh, decoding, "")
    + decoding_programs(served, serving_cfg, mesh, decoding, "serve_", split)
  )


def serving_dtype(dtype: Any) -> Any:
  """bfloat16 for floating-point weights; other dtypes as they are."""
  return jnp.bfloat16 if jnp.issubdtype(dtype, jnp.floating) else dtype


def decoding_programs(
  variables: PyTree, model_cfg: ModelConfig, mesh: Mesh, decoding: Decoding, prefix: str, split: Mesh | None = None
) -> list[Program]:
  """Prefill and one decode step of `variables` (abstract, placed) with rows split over the mesh (or over the
  (rows, tensor) mesh `split`, each chip its share of the model), named with `prefix`."""
  B, P_len, S = decoding.batch, decoding.prompt_len, model_cfg.T
  if split is None:
    rows = cache_placement = rows_sharding(mesh, B)  # B·H cache rows, each device its own B
    prefill = jax.jit(functools.partial(decode.prefill, cfg=model_cfg, mesh=mesh))
    step = jax.jit(functools.partial(decode.decode_step, cfg=model_cfg, mesh=mesh))
  else:
    tensor_parallel.check(model_cfg, split, B)
    rows = NamedSharding(split, P(tensor_parallel.ROWS))
    cache_placement = tensor_parallel.cache_sharding(split)  # each chip its rows' own heads
    prefill = jax.jit(functools.partial(tensor_parallel.prefill, cfg=model_cfg, mesh=split))
    step = jax.jit(functools.partial(tensor_parallel.decode_step, cfg=model_cfg, mesh=split))
  cache = jax.tree.map(
    lambda x: abstract(x.shape, x.dtype, cache_placement), jax.eval_shape(lambda: decode.init_cache(model_cfg, B, S))
  )
  N, head = matmul_params(variables["params"], model_cfg), model_cfg.V * model_cfg.D
  forward = lambda params, context: costs.forward_flops_per_token(params, model_cfg.L, model_cfg.D, context)
  prefill_flops = B * P_len * forward(N - head, P_len) + B * 2 * head  # logits of each row's last token only
  prompt, lengths = abstract((B, P_len), jnp.int32, rows), abstract((B,), jnp.int32, rows)
  tokens, index = abstract((B,), jnp.int32, rows), abstract((B,), jnp.int32, rows)
  return [
    Program(
      f"{prefix}prefill",
      lambda: prefill.lower(variables, prompt_BxP=prompt, lengths_B=lengths, cache=cache),
      prefill_flops / mesh.size,
      B * P_len,
    ),
    Program(
      f"{prefix}decode_step",
      lambda: step.lower(variables, tokens_B=tokens, index_B=index, cache=cache),
      B * forward(N, S) / mesh.size,
      B,
    ),
  ]


def matmul_params(params: PyTree, model_cfg: ModelConfig) -> int:
  """The parameters a token's forward multiplies by: all but the lookup tables (the embedding when the head is its
  own matrix, gpt2's learned positions)."""
  lookups = (0 if model_cfg.tie_embeddings else model_cfg.V * model_cfg.D) + (
    model_cfg.T * model_cfg.D if model_cfg.family == "gpt2" else 0
  )
  return param_count(params) - lookups


def fold_variables(variables: PyTree, model_cfg: Any) -> PyTree:
  """The folded variables alone (`fold.fold` without its config)."""
  return fold_lib.fold(variables, model_cfg)[0]


def run_programs(cfg: ml_collections.ConfigDict, mesh: Mesh, decoding: Decoding | None) -> list[Program]:
  """Every program of the run `cfg` describes, for `mesh` (the inference ones unless `decoding` is None)."""
  trainer = Trainer(cfg, mesh)  # checks the config against the mesh before anything is traced
  return training(trainer) + (inference(trainer, decoding) if decoding else [])
