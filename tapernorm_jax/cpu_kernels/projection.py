"""The model's einsum with its backward written out as two einsums, for training on CPU (plain JAX).

Differentiating `jnp.einsum` leaves XLA:CPU a dot_general followed by transposes, and at the
TinyStories shapes it then materialises activation-sized gradients in transposed layouts (a 10,000 ×
B·T copy of the logits' gradient, the MLP's and attention's input gradients) before the weight-gradient
GEMMs. Asking for each gradient directly in its operand's axis order (`dx = einsum(dy, w → x)`,
`dw = einsum(x, dy → w)`) let XLA:CPU pick layouts without most of those copies (docs/benchmarks.md, "Where
the time goes"). Same products, same numbers up to float32 summation order.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum(spec: str, x: Array, w: Array) -> Array:
  """`jnp.einsum(spec, x, w)`."""
  return jnp.einsum(spec, x, w)


def _forward(spec: str, x: Array, w: Array) -> tuple[Array, tuple[Array, Array]]:
  return jnp.einsum(spec, x, w), (x, w)


def _backward(spec: str, saved: tuple[Array, Array], dy: Array) -> tuple[Array, Array]:
  """(dx, dw), each an einsum that produces its operand's axes in order."""
  x, w = saved
  (x_axes, w_axes), y_axes = spec.split("->")[0].split(","), spec.split("->")[1]
  dx = jnp.einsum(f"{y_axes},{w_axes}->{x_axes}", dy, w).astype(x.dtype)
  dw = jnp.einsum(f"{x_axes},{y_axes}->{w_axes}", x, dy).astype(w.dtype)
  return dx, dw


_einsum.defvjp(_forward, _backward)


def einsum_explicit_backward(module: nn.Module, name: str, spec: str, x_BxTx___: Array, w: Array,
                             part: slice | None = None) -> Array:
  """A `Projection` (model/transformer.py): `jnp.einsum(spec, x, w)` whose VJP is two explicit einsums."""
  del module, name, part  # the product needs only x, w and the spec
  return _einsum(spec, x_BxTx___, w)
