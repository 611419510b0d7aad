"""Learning-rate and gate schedules: pure functions of the (traced) step (docs/method.md §4)."""

import jax
import jax.numpy as jnp
import optax

from tapernorm_jax.taper.phases import Phases  # the step boundaries these schedules read


def learning_rate(peak: float, phases: Phases) -> optax.Schedule:
  """Linear warmup to `peak`, then cosine to 0 at the last step."""
  return optax.warmup_cosine_decay_schedule(0.0, peak, max(phases.lr_warmup, 1), max(phases.steps, 2), 0.0)


def gate(step: jax.Array | int, phases: Phases) -> jax.Array:
  """1 before the taper start, half-cosine to 0 at the taper end, 0 after (docs/method.md §4)."""
  step = jnp.asarray(step, jnp.float32)
  span = max(phases.taper_end - phases.taper_start, 1)
  progress = jnp.clip((step - phases.taper_start) / span, 0.0, 1.0)
  return jnp.where(progress >= 1.0, 0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * progress))).astype(jnp.float32)
