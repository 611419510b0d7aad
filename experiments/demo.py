"""A forward pass of the CPU-sized all_taper model at several gate values (one compiled function)."""

import jax
import jax.numpy as jnp

from configs import all_taper
from tapernorm_jax.model import Transformer, init, param_count


def main() -> None:
  """Builds the model from the config and prints logit statistics as the gate moves 1 → 0."""
  cfg = all_taper.get_config()
  model = Transformer(cfg.model)
  variables = init(cfg.model, jax.random.key(cfg.seed))
  tokens_BxL = jax.random.randint(jax.random.key(1), (2, cfg.model.T), 0, cfg.model.V)
  forward = jax.jit(lambda v, t, g: model.apply(v, t, gate=g))
  print(f"all_taper (cpu preset): {param_count(variables['params']):,} parameters, devices {jax.devices()}")
  for gate in (1.0, 0.5, 0.0):
    logits_BxLxV = forward(variables, tokens_BxL, jnp.float32(gate))
    print(f"gate={gate:.1f}  logits {logits_BxLxV.shape}  mean |logit| {float(jnp.abs(logits_BxLxV).mean()):.5f}")
  print(f"compilations: {forward._cache_size()}")


if __name__ == "__main__":
  main()
