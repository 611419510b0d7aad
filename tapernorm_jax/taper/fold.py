"""Fold: the g = 0 map of every TaperNorm layer absorbed into the next linear layer (docs/method.md §6).

A pure function from variables to variables. At g = 0 a tapered norm is `h ↦ h·A + β`, with
`A = c·diag(γ̃)` (RMS) or `A = c·(I − 11ᵀ/d)·diag(γ̃)` (LN, β its bias). The layer that reads
it, `x ↦ x·W + b`, becomes `h ↦ h·(A·W) + (β·W + b)` and the norm becomes `identity`:

    internal norms  →  attention `qkv` (+ `qkv_bias`), MLP `wi_0` and `wi_1` (SwiGLU) or `wi` (+ `wi_bias`)
    final norm      →  an untied `head` (D, V), plus `logits_bias` (V,) for LN

A RepBN norm (PRepBN, docs/method.md §15) at inference is the same kind of map with its running statistics:
`A = diag(γ_bn/√(var + ε) + η)` and bias `β_bn − γ_bn·mean/√(var + ε)`, in either norm kind; its projections
get biases (`model.input_bias` for llama) and a final one a `logits_bias`.

Norms in the `taper` and `fixed` forms fold (they share variables and the same g = 0 map);
`plain` norms are left as they are. Folded weights keep their shapes, dtypes, logical axes
and, for sharded inputs, their shardings; the new head is placed by the sharding rules.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util
from jax.sharding import NamedSharding

from tapernorm_jax.model import ModelConfig, abstract_variables, check_matches, param_paths, sharding
from tapernorm_jax.model.param_paths import Path

PyTree = Any


def fold(variables: PyTree, model_cfg: Any) -> tuple[PyTree, ModelConfig]:
  """Folds every tapered or RepBN norm into the next projection; returns (folded variables, folded config)."""
  cfg = ModelConfig.from_config(model_cfg)
  if not cfg.foldable:
    raise ValueError(
      f"nothing to fold: model.internal_norm={cfg.internal_norm!r} and model.final_norm="
      f"{cfg.final_norm!r}; fold needs TaperNorm or RepBN layers (a norm in one of the forms "
      f"{param_paths.FOLDABLE_MODES})"
    )
  boxed = _is_boxed(variables)
  plain = nn.unbox(variables)
  check_matches(plain, cfg)
  params = dict(traverse_util.flatten_dict(plain["params"]))
  calib = dict(traverse_util.flatten_dict(plain["calib"]))
  if cfg.final_norm in param_paths.FOLDABLE_MODES and cfg.tie_embeddings:  # the head becomes a matrix of its own
    params[(param_paths.HEAD,)] = params[(param_paths.EMBED,)].T
  for site in param_paths.norm_sites(cfg):
    mode = site.mode(cfg)
    if mode in param_paths.FOLDABLE_MODES:
      norm_params = {k[-1]: v for k, v in params.items() if k[:-1] == site.norm}
      norm_calib = {k[-1]: v for k, v in calib.items() if k[:-1] == site.norm}
      row_scale_D, shift_D = (
        repbn_map(norm_params, norm_calib, cfg.eps)
        if mode == "repbn"
        else norm_map(norm_params, norm_calib[param_paths.C], cfg.norm_kind)
      )
      for weight, bias in zip(site.weights, site.biases):
        if shift_D is not None and bias not in params:  # a bias the folded model has and the trained one had not
          params[bias] = jnp.zeros(params[weight].shape[1:], params[weight].dtype)
        params[weight], new_bias = fold_linear(
          params[weight], params.get(bias), row_scale_D, shift_D, center=mode != "repbn" and cfg.norm_kind == "ln"
        )
        if new_bias is not None:
          params[bias] = new_bias
      _drop_norm(params, calib, site.norm)
  folded = {"params": traverse_util.unflatten_dict(params), "calib": traverse_util.unflatten_dict(calib)}
  folded_cfg = folded_config(cfg)
  check_matches(folded, folded_cfg)
  folded = _place_like(folded, plain, folded_cfg)
  return (_rebox(folded, folded_cfg) if boxed else folded), folded_cfg


def folded_config(model_cfg: Any) -> ModelConfig:
  """The model `fold` turns `model_cfg` into: folded norms become identities, a folded final norm unties the head
  (with a logits bias where its map shifts: LN, RepBN), RepBN internal norms give llama input biases."""
  cfg = ModelConfig.from_config(model_cfg)
  internal, final = cfg.internal_norm in param_paths.FOLDABLE_MODES, cfg.final_norm in param_paths.FOLDABLE_MODES
  return cfg.replace(
    internal_norm="identity" if internal else cfg.internal_norm,
    final_norm="identity" if final else cfg.final_norm,
    tie_embeddings=cfg.tie_embeddings and not final,
    logits_bias=cfg.logits_bias or (final and (cfg.norm_kind == "ln" or cfg.final_norm == "repbn")),
    input_bias=cfg.input_bias or (cfg.family == "llama" and cfg.internal_norm == "repbn"),
  )


def norm_map(norm_params: dict[str, jax.Array], c: jax.Array, kind: str) -> tuple[jax.Array, jax.Array | None]:
  """The g = 0 map of a tapered norm as (row scale c·γ̃, β or None); LN also centres (see `fold_linear`)."""
  gamma_tilde_D = norm_params[param_paths.GAMMA_TILDE]
  ct = jnp.promote_types(gamma_tilde_D.dtype, jnp.float32)
  beta_D = norm_params[param_paths.BETA].astype(ct) if kind == "ln" else None
  return jnp.asarray(c, ct) * gamma_tilde_D.astype(ct), beta_D


def repbn_map(
  norm_params: dict[str, jax.Array], norm_calib: dict[str, jax.Array], eps: float
) -> tuple[jax.Array, jax.Array]:
  """A RepBN norm at inference, BN over its running statistics plus η·h, as (row scale, shift)."""
  ct = jnp.promote_types(norm_params[param_paths.BN_GAMMA].dtype, jnp.float32)
  bn_gamma_D, bn_beta_D, eta = (
    norm_params[n].astype(ct) for n in (param_paths.BN_GAMMA, param_paths.BN_BETA, param_paths.ETA)
  )
  mean_D, var_D = (norm_calib[n].astype(ct) for n in (param_paths.MEAN, param_paths.VAR))
  scale_D = bn_gamma_D * jax.lax.rsqrt(var_D + eps)
  return scale_D + eta, bn_beta_D - scale_D * mean_D


def fold_linear(
  w_DxO: jax.Array, b_O: jax.Array | None, row_scale_D: jax.Array, beta_D: jax.Array | None, center: bool
) -> tuple[jax.Array, jax.Array | None]:
  """W' = A·W and b' = β·W + b for a weight whose first axis is the input width D (O: any trailing axes); `center`:
  A holds LN's centring (I − 11ᵀ/d) too."""
  ct = jnp.promote_types(jnp.promote_types(w_DxO.dtype, jnp.float32), row_scale_D.dtype)
  w = w_DxO.astype(ct)
  folded_DxO = row_scale_D.astype(ct).reshape((-1,) + (1,) * (w.ndim - 1)) * w
  if center:  # (I − 11ᵀ/d)·M subtracts the mean over input rows
    folded_DxO = folded_DxO - jnp.mean(folded_DxO, axis=0, keepdims=True)
  new_b = b_O
  if beta_D is not None:
    shift_O = jnp.tensordot(beta_D.astype(ct), w, axes=1, precision=jax.lax.Precision.HIGHEST)
    new_b = (shift_O if b_O is None else b_O.astype(ct) + shift_O).astype((w_DxO if b_O is None else b_O).dtype)
  return folded_DxO.astype(w_DxO.dtype), new_b


def _drop_norm(params: dict[Path, Any], calib: dict[Path, Any], norm: Path) -> None:
  """Removes a folded norm's parameters and calibration scalars (an identity norm has none)."""
  for tree in (params, calib):
    for key in [k for k in tree if k[:-1] == norm]:
      del tree[key]


def _is_boxed(variables: PyTree) -> bool:
  """Whether any leaf carries logical axis names (`nn.Partitioned`)."""
  leaves = jax.tree.leaves(variables, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  return any(isinstance(x, nn.Partitioned) for x in leaves)


def _rebox(folded: PyTree, cfg: ModelConfig) -> PyTree:
  """Boxes the folded arrays with the folded model's logical axis names."""
  abstract = abstract_variables(cfg)
  is_box = lambda x: isinstance(x, nn.Partitioned)
  return jax.tree.map(lambda box, x: box.replace_boxed(x) if is_box(box) else x, abstract, folded, is_leaf=is_box)


def _place_like(folded: PyTree, original: PyTree, cfg: ModelConfig) -> PyTree:
  """Kept leaves get their input sharding back; new leaves (the head) follow the rules on the input's mesh."""
  flat_in = traverse_util.flatten_dict(original)
  placed_in = {k: x for k, x in flat_in.items() if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)}
  mesh = next((x.sharding.mesh for x in placed_in.values() if isinstance(x.sharding, NamedSharding)), None)
  if mesh is None:
    return folded
  rules = traverse_util.flatten_dict(sharding.shardings(abstract_variables(cfg), mesh))
  placed = {}
  for key, x in traverse_util.flatten_dict(folded).items():
    old = placed_in.get(key)
    target = old.sharding if old is not None and old.shape == x.shape else rules[key]
    placed[key] = jax.device_put(x, target)
  return traverse_util.unflatten_dict(placed)
