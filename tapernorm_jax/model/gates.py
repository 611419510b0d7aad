"""The gates of a model's norms, one field per norm position: built once by a method, read by name in the model.

A gate blends a norm's normalized branch (1) with its fixed g = 0 map (0). `Gates` holds one per norm position:
the attention norm of every block (`attn`, L values), its value path where a method gates that apart (`attn_value`,
L values, or None: the value path takes the attention norm's gate), the MLP norm of every block (`mlp`) and the
final norm (`final`, a scalar). `Gates.uniform(g, L)` is one gate for every norm (TaperNorm's); `as_gates` accepts a
scalar too, so `Transformer(cfg).apply(variables, tokens, gate=0.5)` keeps working. `Gates` is a NamedTuple, so a
pytree: it passes through `jit`, `remat` and `lax` as its arrays do.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class BlockGates(NamedTuple):
  """One block's gates: its attention norm's (queries and keys), its MLP norm's, its value path's or None."""

  attn: Array
  mlp: Array
  attn_value: Array | None = None


class Gates(NamedTuple):
  """Every norm's gate by position: `attn` and `mlp` (L,), `final` (), `attn_value` (L,) or None."""

  attn: Array
  mlp: Array
  final: Array
  attn_value: Array | None = None

  @classmethod
  def uniform(cls, gate: Array | float, L: int) -> "Gates":
    """One gate `gate` for every norm of an L-block model (the value paths follow their attention norms)."""
    g = jnp.asarray(gate, jnp.float32)
    return cls(attn=jnp.broadcast_to(g, (L,)), mlp=jnp.broadcast_to(g, (L,)), final=g)

  def block(self, i: int) -> BlockGates:
    """Block i's gates."""
    return BlockGates(self.attn[i], self.mlp[i], None if self.attn_value is None else self.attn_value[i])

  def mean(self) -> Array:
    """The mean gate over every gated position (value paths included): the `gate` metric."""
    leaves = [jnp.ravel(x) for x in jax.tree.leaves(self)]
    return jnp.mean(jnp.concatenate(leaves))


def as_gates(gate: Gates | Array | float, L: int) -> Gates:
  """`gate` as `Gates` of an L-block model: a scalar for every norm, or a `Gates`; ValueError naming the fix for a
  gate outside [0, 1] (checked where it is concrete; a traced gate cannot be) or of another shape."""
  leaves = jax.tree.leaves(gate)
  if not any(isinstance(x, jax.core.Tracer) for x in leaves):
    values = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in leaves]) if leaves else np.zeros(0)
    if not np.all((values >= 0) & (values <= 1)):
      shown = values.tolist() if values.size <= 8 else f"{values.size} values, min {values.min()}, max {values.max()}"
      raise ValueError(f"gate={shown}: must lie in [0, 1] (1: the normalized branch, 0: the g = 0 map)")
  if isinstance(gate, Gates):
    check_shapes(gate, L)
    return Gates(*(None if x is None else jnp.asarray(x, jnp.float32) for x in gate))
  if np.ndim(gate) != 0:
    raise ValueError(
      f"gate has shape {np.shape(gate)}; give a scalar (one gate for every norm) or a "
      "tapernorm_jax.model.gates.Gates (one field per norm position)"
    )
  return Gates.uniform(gate, L)


def check_shapes(gates: Gates, L: int) -> None:
  """ValueError naming the first field of `gates` whose shape is not an L-block model's."""
  expected: dict[str, Any] = {"attn": (L,), "mlp": (L,), "final": (), "attn_value": (L,)}
  for name, value in gates._asdict().items():
    if value is not None and np.shape(value) != expected[name]:
      raise ValueError(
        f"gates.{name} has shape {np.shape(value)}; a model of model.L={L} blocks takes shape {expected[name]}"
      )
