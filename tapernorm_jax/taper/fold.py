"""Fold: the g = 0 map of every TaperNorm layer absorbed into the next linear layer (docs/method.md §6).

A pure function from variables to variables. At g = 0 a tapered norm is `h ↦ h·A + β`, with
`A = c·diag(γ̃)` (RMS) or `A = c·(I − 11ᵀ/d)·diag(γ̃)` (LN, β its bias). The layer that reads
it, `x ↦ x·W + b`, becomes `h ↦ h·(A·W) + (β·W + b)` and the norm becomes `identity`:

    internal norms  →  attention `qkv` (+ `qkv_bias`), MLP `wi_0` and `wi_1` (SwiGLU) or `wi` (+ `wi_bias`)
    final norm      →  an untied `head` (D, V), plus `logits_bias` (V,) for LN

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
  """Folds every tapered norm into the next projection; returns (folded variables, folded config)."""
  cfg = ModelConfig.from_config(model_cfg)
  internal, final = cfg.internal_norm in param_paths.CALIBRATED_MODES, cfg.final_norm in param_paths.CALIBRATED_MODES
  if not cfg.tapered:
    raise ValueError(f"nothing to fold: model.internal_norm={cfg.internal_norm!r} and model.final_norm="
                     f"{cfg.final_norm!r}; fold needs TaperNorm layers (a norm in one of the forms "
                     f"{param_paths.CALIBRATED_MODES})")
  boxed = _is_boxed(variables)
  plain = nn.unbox(variables)
  check_matches(plain, cfg)
  params = dict(traverse_util.flatten_dict(plain["params"]))
  calib = dict(traverse_util.flatten_dict(plain["calib"]))
  head, logits_bias = (param_paths.HEAD,), (param_paths.LOGITS_BIAS,)
  if final and cfg.tie_embeddings:  # the head becomes a matrix of its own
    params[head] = params[(param_paths.EMBED,)].T
  if final and cfg.norm_kind == "ln" and logits_bias not in params:
    params[logits_bias] = jnp.zeros((cfg.V,), params[head].dtype)
  for site in param_paths.norm_sites(cfg):
    if internal if site.internal else final:
      for weight in site.weights:
        _fold_norm(params, calib, cfg, site.norm, weight, site.bias)
      _drop_norm(params, calib, site.norm)
  folded_cfg = folded_config(cfg)
  folded = {"params": traverse_util.unflatten_dict(params), "calib": traverse_util.unflatten_dict(calib)}
  check_matches(folded, folded_cfg)
  folded = _place_like(folded, plain, folded_cfg)
  return (_rebox(folded, folded_cfg) if boxed else folded), folded_cfg


def folded_config(model_cfg: Any) -> ModelConfig:
  """The model `fold` turns `model_cfg` into: tapered norms become identities, a tapered final norm unties the head
  (with a logits bias for LN)."""
  cfg = ModelConfig.from_config(model_cfg)
  internal, final = cfg.internal_norm in param_paths.CALIBRATED_MODES, cfg.final_norm in param_paths.CALIBRATED_MODES
  return cfg.replace(internal_norm="identity" if internal else cfg.internal_norm,
                     final_norm="identity" if final else cfg.final_norm,
                     tie_embeddings=cfg.tie_embeddings and not final,
                     logits_bias=cfg.logits_bias or (final and cfg.norm_kind == "ln"))


def norm_map(norm_params: dict[str, jax.Array], c: jax.Array, kind: str) -> tuple[jax.Array, jax.Array | None]:
  """The g = 0 map of a tapered norm as (row scale c·γ̃, β or None); LN also centres (see `fold_linear`)."""
  gamma_tilde_D = norm_params[param_paths.GAMMA_TILDE]
  ct = jnp.promote_types(gamma_tilde_D.dtype, jnp.float32)
  beta_D = norm_params[param_paths.BETA].astype(ct) if kind == "ln" else None
  return jnp.asarray(c, ct) * gamma_tilde_D.astype(ct), beta_D


def fold_linear(w_DxO: jax.Array, b_O: jax.Array | None, row_scale_D: jax.Array, beta_D: jax.Array | None,
                kind: str) -> tuple[jax.Array, jax.Array | None]:
  """W' = A·W and b' = β·W + b for a weight whose first axis is the input width D (O: any trailing axes)."""
  ct = jnp.promote_types(jnp.promote_types(w_DxO.dtype, jnp.float32), row_scale_D.dtype)
  w = w_DxO.astype(ct)
  folded_DxO = row_scale_D.astype(ct).reshape((-1,) + (1,) * (w.ndim - 1)) * w
  if kind == "ln":  # (I − 11ᵀ/d)·M subtracts the mean over input rows
    folded_DxO = folded_DxO - jnp.mean(folded_DxO, axis=0, keepdims=True)
  new_b = b_O
  if beta_D is not None:
    shift_O = jnp.tensordot(beta_D.astype(ct), w, axes=1, precision=jax.lax.Precision.HIGHEST)
    new_b = (shift_O if b_O is None else b_O.astype(ct) + shift_O).astype((w_DxO if b_O is None else b_O).dtype)
  return folded_DxO.astype(w_DxO.dtype), new_b


def _fold_norm(params: dict[Path, jax.Array], calib: dict[Path, jax.Array], cfg: ModelConfig, norm: Path,
               weight: Path, bias: Path) -> None:
  """Folds the norm at path `norm` into `params[weight]` (and `params[bias]` when the norm has β)."""
  norm_params = {k[-1]: v for k, v in params.items() if k[:-1] == norm}
  row_scale_D, beta_D = norm_map(norm_params, calib[norm + (param_paths.C,)], cfg.norm_kind)
  params[weight], new_bias = fold_linear(params[weight], params.get(bias), row_scale_D, beta_D, cfg.norm_kind)
  if new_bias is not None:
    params[bias] = new_bias


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
