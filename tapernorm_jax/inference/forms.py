"""The inference forms of one set of tapered weights: `baseline` (plain norms), `fixed` (the g = 0 map as an explicit
multiply), `folded` (the map folded into the next projection) and `identity` (no norms: the upper bound); the fold
of a tapered model, weights that look calibrated for tests and benchmarks, and a last-token forward."""

from typing import Any

import flax.linen as nn
import jax
from flax import traverse_util

from tapernorm_jax.model import ModelConfig, Transformer, abstract_variables, init, param_paths
from tapernorm_jax.model.norms import POINTWISE_MODES
from tapernorm_jax.taper import fold as fold_lib

PyTree = Any
FORMS = ("baseline", "fixed", "folded", "identity")


def inference_form(variables: PyTree, cfg: ModelConfig) -> tuple[PyTree, ModelConfig]:
  """The model as it runs at inference: its tapered or RepBN norms folded (its g = 0 forward); others unchanged."""
  return fold_lib.fold(variables, cfg) if cfg.foldable else (variables, cfg)


def forms(variables: PyTree, cfg: ModelConfig) -> dict[str, tuple[PyTree, ModelConfig]]:
  """One set of tapered weights as `baseline` (plain norms), `fixed` (the g = 0 map as an explicit multiply),
  `folded` and `identity` (no norms: the upper bound), each with exactly the variables it reads."""
  if not cfg.tapered:
    raise ValueError(f"forms need a tapered model (internal_norm={cfg.internal_norm!r}, final_norm={cfg.final_norm!r})")
  plain = lambda mode: "plain" if mode in param_paths.CALIBRATED_MODES else mode
  configs = {
    "baseline": cfg.replace(internal_norm=plain(cfg.internal_norm), final_norm=plain(cfg.final_norm)),
    "fixed": cfg.fixed_form(),
    "identity": cfg.replace(internal_norm="identity", final_norm="identity"),
  }
  out = {name: (select(variables, form_cfg), form_cfg) for name, form_cfg in configs.items()}
  out["folded"] = fold_lib.fold(variables, cfg)
  return {name: out[name] for name in FORMS}


def pointwise(variables: PyTree, cfg: ModelConfig, mode: str, key: jax.Array) -> tuple[PyTree, ModelConfig]:
  """The same weights with every norm a point-wise one (`dyt` or `derf`, model/norms.py), which has no fold: its α,
  γ, β and embedding scale freshly initialised, every other weight taken from `variables`."""
  if mode not in POINTWISE_MODES:
    raise ValueError(f"mode={mode!r}: a point-wise norm is one of {POINTWISE_MODES}")
  form_cfg = cfg.replace(internal_norm=mode, final_norm=mode)
  shared = traverse_util.flatten_dict(variables)
  own = traverse_util.flatten_dict(nn.unbox(init(form_cfg, key)))
  return traverse_util.unflatten_dict({k: shared.get(k, x) for k, x in own.items()}), form_cfg


def select(variables: PyTree, cfg: ModelConfig) -> PyTree:
  """The subset of `variables` that the model `cfg` reads."""
  flat = traverse_util.flatten_dict(variables)
  wanted = traverse_util.flatten_dict(nn.unbox(abstract_variables(cfg)))
  return traverse_util.unflatten_dict({k: flat[k] for k in wanted})


def perturbed(
  variables: PyTree, key: jax.Array, c_range: tuple[float, float] = (0.3, 3.0), spread: float = 0.3
) -> PyTree:
  """Unboxed variables with every c drawn from `c_range` and every 1-D parameter (γ, γ̃, β, biases) moved by
  `spread`·N(0, 1): weights that look calibrated, so that every part of a fold or a form matters."""
  flat = traverse_util.flatten_dict(nn.unbox(variables))
  keys = iter(jax.random.split(key, len(flat)))
  out = {}
  for path, x in flat.items():
    k = next(keys)
    if path[0] == "calib" and path[-1] == param_paths.C:
      x = jax.random.uniform(k, x.shape, x.dtype, *c_range)
    elif path[0] == "params" and x.ndim == 1:
      x = x + spread * jax.random.normal(k, x.shape, x.dtype)
    out[path] = x
  return traverse_util.unflatten_dict(out)


def last_token_logits(cfg: ModelConfig, every_position: bool = False) -> Any:
  """A jitted last-token-logits forward (B×V): every block but the last on all positions, the rest on the last;
  `every_position`: every block on every position, only the head on the last (what Hugging Face's
  `logits_to_keep=1` does)."""
  model = Transformer(cfg)

  def forward(variables: PyTree, tokens_BxT: jax.Array) -> jax.Array:
    if every_position:
      h_Bx1xD = model.apply(variables, tokens_BxT, 0.0, method=Transformer.hidden)[:, -1:]
    else:
      h_Bx1xD = model.apply(variables, tokens_BxT, 0.0, method=Transformer.last_hidden)
    return model.apply(variables, h_Bx1xD, 0.0, method=Transformer.logits)[:, 0]

  return jax.jit(forward)
