"""A model's variables: initialised, as shapes only, counted, and checked against a config."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from tapernorm_jax.model.config import ModelConfig
from tapernorm_jax.model.transformer import Transformer

PyTree = Any
Array = jax.Array


def init(cfg: Any, rng: Array, batch: int = 1, length: int = 8) -> dict[str, Any]:
  """Initial variables (params and calib), still boxed with their logical axis names."""
  model = Transformer(cfg)
  return model.init(rng, jnp.zeros((batch, min(length, model.cfg.T)), jnp.int32))


def abstract_variables(cfg: Any) -> dict[str, Any]:
  """The variables `init` would make, as boxed ShapeDtypeStructs (nothing is computed)."""
  return jax.eval_shape(lambda: init(cfg, jax.random.key(0)))


def param_count(params: Any) -> int:
  """Number of trainable scalars (γ̃ included)."""
  return sum(x.size for x in jax.tree.leaves(nn.unbox(params)))


def check_matches(variables: PyTree, cfg: ModelConfig) -> None:
  """Raises ValueError naming the differences if `variables` are not the params and calib of `cfg`."""
  missing_collections = [c for c in ("params", "calib") if c not in variables]
  if missing_collections:
    raise ValueError(f"variables lack the collection(s) {missing_collections}; pass {{'params': ..., 'calib': ...}}")
  expected = nn.unbox(abstract_variables(cfg))
  problems = []
  for collection in ("params", "calib"):
    want = {k: tuple(v.shape) for k, v in traverse_util.flatten_dict(expected.get(collection, {})).items()}
    have = {k: tuple(jnp.shape(v)) for k, v in traverse_util.flatten_dict(variables[collection]).items()}
    problems += [
      f"{collection}/{'/'.join(k)} missing (expected shape {want[k]})" for k in sorted(set(want) - set(have))
    ]
    problems += [f"{collection}/{'/'.join(k)} is not in the model" for k in sorted(set(have) - set(want))]
    problems += [
      f"{collection}/{'/'.join(k)} has shape {have[k]}, the model expects {want[k]}"
      for k in sorted(set(want) & set(have))
      if want[k] != have[k]
    ]
  if problems:
    shown = "; ".join(problems[:6]) + (f"; … {len(problems) - 6} more" if len(problems) > 6 else "")
    raise ValueError(
      f"the variables do not match the model config (family={cfg.family}, D={cfg.D}, L={cfg.L}, "
      f"internal_norm={cfg.internal_norm}, final_norm={cfg.final_norm}, "
      f"tie_embeddings={cfg.tie_embeddings}): {shown}"
    )
