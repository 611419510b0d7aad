"""Shared by the inference tests: initial variables and a cached, jitted forward per model config."""

import functools

import jax
import jax.numpy as jnp

from tapernorm_jax.inference import forms
from tapernorm_jax.model import ModelConfig, Transformer, init


def init_variables(cfg: ModelConfig, seed: int = 0):
  """Boxed initial variables."""
  return init(cfg, jax.random.key(seed))


def perturbed_variables(cfg: ModelConfig) -> dict:
  """Unboxed variables whose γ̃, β and c are moved off their defaults, so outputs depend on every one."""
  return forms.perturbed(init_variables(cfg), jax.random.key(1), c_range=(0.5, 2.0), spread=0.2)


@functools.cache
def jitted_forward(cfg: ModelConfig):
  """The model's jitted forward (one compilation per config)."""
  return jax.jit(lambda v, t, g: Transformer(cfg).apply(v, t, gate=g))


def logits_at(cfg: ModelConfig, variables, tokens, gate: float = 0.0) -> jax.Array:
  """The model's logits at `gate`."""
  return jitted_forward(cfg)(variables, tokens, jnp.float32(gate))
