"""A few rows times a weight on CPU, reading the weight once: the custom call behind batched decode.

XLA:CPU has no kernel for a product of 2–8 rows with a large weight: it either packs the weight for a
GEMM or (`few_rows.rowwise_projection`) reads it once per row. `matvec_rows.cc` reads each weight row
once and dots it with every row; it needs the weight as output × input (input axis minor), which
`few_rows.prepare` makes once, outside the decoding loop.

The source is compiled on first use (`build.py`: the system C++ compiler against jaxlib's FFI headers,
cached under `$TAPERNORM_CACHE`). Where that fails (no compiler, `TAPERNORM_MATVEC=0`), `available()` is
False, `reason()` says why, and decoding goes one row at a time instead.
"""

import functools
import os

import jax
import jax.numpy as jnp

from tapernorm_jax.cpu_kernels import build

SOURCE = build.HERE / "matvec_rows.cc"
TARGET = "tapernorm_matvec_rows"
MAX_ROWS = 8


@functools.cache
def _load() -> str:
  """Builds, loads and registers the kernel; '' when it is ready, else why not."""
  if os.environ.get("TAPERNORM_MATVEC", "1") == "0":
    return "disabled by TAPERNORM_MATVEC=0"
  return build.register(
    SOURCE, {TARGET: "MatvecRows"}, without="batched decoding reads the weights once per row instead, more slowly"
  )


def available() -> bool:
  """Whether the kernel is built and registered (for CPU targets only: `few_rows.projection_for` checks)."""
  return not reason()


def reason() -> str:
  """Why the kernel is not used ('' when it is)."""
  return _load()


def rows(x_RxK: jax.Array, w_OxK: jax.Array) -> jax.Array:
  """x_RxK @ w_OxK.T (R×O) for 1 ≤ R ≤ 8 rows, float32, each weight row read once; needs `available()`."""
  (R, K), (O, K_w) = x_RxK.shape, w_OxK.shape
  if not 1 <= R <= MAX_ROWS or K != K_w or x_RxK.dtype != jnp.float32 or w_OxK.dtype != jnp.float32:
    raise ValueError(
      f"matvec.rows: x {x_RxK.shape} {x_RxK.dtype}, w {w_OxK.shape} {w_OxK.dtype}; needs 1 to "
      f"{MAX_ROWS} float32 rows and a float32 output×input weight of the same input width"
    )
  if not available():
    raise RuntimeError(f"matvec.rows: the kernel is not available ({reason()})")
  return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((R, O), jnp.float32))(x_RxK, w_OxK)
