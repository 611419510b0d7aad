"""Pretrained starts: a Hugging Face GPT-2 checkpoint (plain LayerNorms) checked against the run's model config and
its parameters laid onto that model's, each tapered norm starting with γ̃ = γ (`init_from`, docs/gpt2.md)."""

from typing import Any

import jax.numpy as jnp
from flax import traverse_util

from tapernorm_jax.model import ModelConfig, param_paths

PyTree = Any
FITTING_FIELDS = ("family", "V", "D", "H", "L", "T", "mlp_dim", "eps", "tie_embeddings")


def check_fits(model_cfg: ModelConfig, pretrained_cfg: ModelConfig, source: str) -> None:
  """Raises ValueError naming every model field where the run's config differs from the pretrained model's."""
  differing = [
    f"model.{f}: {getattr(model_cfg, f)!r} here, {getattr(pretrained_cfg, f)!r} in {source}"
    for f in FITTING_FIELDS
    if getattr(model_cfg, f) != getattr(pretrained_cfg, f)
  ]
  if differing:
    raise ValueError(
      f"init_from={source!r} does not fit the model config: "
      + "; ".join(differing)
      + ". Set those fields (--config.model.X=) or use the preset that matches the checkpoint."
    )


def load(source: str, model_cfg: ModelConfig) -> PyTree:
  """The parameters of the GPT-2 checkpoint `source` (a directory or hub name), after `check_fits`."""
  from tapernorm_jax.hf import gpt2  # the hub client and safetensors: only for pretrained starts

  variables, pretrained_cfg = gpt2.load_gpt2(source)
  check_fits(model_cfg, pretrained_cfg, source)
  return variables["params"]


REPBN_ONLY = (param_paths.BN_GAMMA, param_paths.BN_BETA, param_paths.ETA)  # start at 0: RepBN adds nothing at first


def merge(fresh: PyTree, given: PyTree) -> PyTree:
  """`fresh` (a model's initial parameters) with every tensor taken from `given` (a model with plain norms), γ̃ from
  its norm's γ, RepBN's parameters (which a plain norm has none of) at their initial values; ValueError naming what
  is missing, misshapen or unknown."""
  flat_fresh, flat_given = traverse_util.flatten_dict(fresh), traverse_util.flatten_dict(given)
  merged, problems = {}, []
  for path, init_value in flat_fresh.items():
    source = path[:-1] + (param_paths.GAMMA,) if path[-1] == param_paths.GAMMA_TILDE else path
    if path[-1] in REPBN_ONLY:
      merged[path] = init_value
    elif source not in flat_given:
      problems.append(f"{'/'.join(path)} is missing")
    elif jnp.shape(flat_given[source]) != init_value.shape:
      problems.append(f"{'/'.join(source)} has shape {jnp.shape(flat_given[source])}, expected {init_value.shape}")
    else:
      merged[path] = jnp.asarray(flat_given[source], init_value.dtype)
  problems += [f"{'/'.join(p)} is not in the model" for p in flat_given if p not in flat_fresh]
  if problems:
    raise ValueError("the pretrained parameters do not fit the model: " + "; ".join(problems[:6]))
  return traverse_util.unflatten_dict(merged)
