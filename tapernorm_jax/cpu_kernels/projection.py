"""The model's products as 2-D matrix products with their backward written out, for training on CPU (plain JAX).

Differentiating `jnp.einsum` leaves XLA:CPU dot_generals over the model's many-axis operands (a B×T×3×H×K query,
key and value gradient against a D×3×H×K weight), and at the TinyStories shapes it then materialises
activation-sized gradients and weights in permuted layouts before the GEMMs (a 10,000 × B·T copy of the logits'
gradient, the fused projection's weight as 3·H·K × D). Here every product is one matrix product of x flattened to
M × (contracted features) and w to the matching 2-D matrix, and its gradients are the two matrix products that
give each operand in its own row-major layout (`dx = dy·wᵀ`, `dw = xᵀ·dy`): the reshapes are free, and XLA:CPU is
left no transpose to make (docs/benchmarks.md, "Where the time goes"). Same products, same numbers up to float32
summation order.
"""

import functools
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


class MatrixForm(NamedTuple):
  """`einsum(spec, x, w)` as an M×C by C×N product (`w_leads`; else w is N×C), and the einsum's output shape."""

  M: int
  C: int
  N: int
  w_leads: bool
  y_shape: tuple[int, ...]


def matrix_form(spec: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> MatrixForm:
  """The matrix product `einsum(spec, x, w)` is: x's trailing axes contracted with w's leading or trailing ones
  (in the same order), the output x's other axes, then w's; ValueError naming the spec otherwise."""
  (x_axes, w_axes), y_axes = spec.split("->")[0].split(","), spec.split("->")[1]
  contracted = "".join(a for a in x_axes if a in w_axes)
  w_leads = w_axes.startswith(contracted)
  x_kept, w_kept = x_axes[: len(x_axes) - len(contracted)], w_axes.replace(contracted, "")
  if not x_axes.endswith(contracted) or not (w_leads or w_axes.endswith(contracted)) or y_axes != x_kept + w_kept:
    raise ValueError(
      f"cpu_kernels.projection: {spec!r} is not a matrix product of x's trailing axes with w's "
      "leading or trailing ones; pass the model's own einsum as its projection"
    )
  C = math.prod(x_shape[len(x_kept) :])
  w_kept_shape = w_shape[len(contracted) :] if w_leads else w_shape[: len(w_kept)]
  return MatrixForm(
    math.prod(x_shape[: len(x_kept)]),
    C,
    math.prod(w_kept_shape),
    w_leads,
    tuple(x_shape[: len(x_kept)]) + tuple(w_kept_shape),
  )


def _dot(a: Array, b: Array, a_axis: int, b_axis: int) -> Array:
  """The matrix product of 2-D a and b contracting a's `a_axis` with b's `b_axis`, named for profiles."""
  with jax.named_scope("matrix_product"):
    return lax.dot_general(a, b, (((a_axis,), (b_axis,)), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _product(spec: str, x: Array, w: Array) -> Array:
  """`jnp.einsum(spec, x, w)` as one matrix product."""
  return _forward(spec, x, w)[0]


def _forward(spec: str, x: Array, w: Array) -> tuple[Array, tuple[Array, Array]]:
  f = matrix_form(spec, x.shape, w.shape)
  w_2d = w.reshape((f.C, f.N) if f.w_leads else (f.N, f.C))
  return _dot(x.reshape(f.M, f.C), w_2d, 1, 0 if f.w_leads else 1).reshape(f.y_shape), (x, w)


def _backward(spec: str, saved: tuple[Array, Array], dy: Array) -> tuple[Array, Array]:
  """(dx, dw), each a matrix product that gives its operand in row-major order."""
  x, w = saved
  f = matrix_form(spec, x.shape, w.shape)
  x_MxC, dy_MxN = x.reshape(f.M, f.C), dy.reshape(f.M, f.N)
  dx_MxC = _dot(dy_MxN, w.reshape((f.C, f.N) if f.w_leads else (f.N, f.C)), 1, 1 if f.w_leads else 0)
  dw_2d = _dot(x_MxC, dy_MxN, 0, 0) if f.w_leads else _dot(dy_MxN, x_MxC, 0, 0)
  return dx_MxC.reshape(x.shape).astype(x.dtype), dw_2d.reshape(w.shape).astype(w.dtype)


_product.defvjp(_forward, _backward)


def matrix_product(
  module: nn.Module, name: str, spec: str, x_BxTx___: Array, w: Array, part: slice | None = None
) -> Array:
  """A `Projection` (model/seams.py): `jnp.einsum(spec, x, w)` as one 2-D matrix product, its VJP two more."""
  del module, name, part  # the product needs only x, w and the spec
  dtype = jnp.result_type(x_BxTx___, w)  # as einsum promotes; dot_general wants one dtype
  return _product(spec, x_BxTx___.astype(dtype), w.astype(dtype))
