"""Causal attention for training on CPU: a fused forward and backward per (batch, head) pair (custom calls).

XLA:CPU runs `blocked` attention (model/attention.py) as batched products and elementwise passes over
each block of scores, every pass through memory; at the TinyStories widths (heads of 4–32 features)
that is most of a train step. `attention_rows.cc` keeps one pair's keys and values in cache while each
query row computes its scores, softmax and output, and its backward recomputes the softmax from the
saved log-sum-exp. Both are plain C++ (vector extensions, no intrinsics) compiled on first use
(`build.py`); `TAPERNORM_CPU_ATTENTION=0` turns them off. The model reaches them only through its
attention seam (`Transformer(cfg, attend=...)`), where `cpu_kernels.attention_for` puts them.
"""

import functools
import os

import jax
import jax.numpy as jnp

from tapernorm_jax.cpu_kernels import build

Array = jax.Array
SOURCE = build.HERE / "attention_rows.cc"
TARGETS = {"tapernorm_attention_forward": "AttentionForward", "tapernorm_attention_backward": "AttentionBackward"}
# Reassociated float sums (vectorised reductions) and no errno or traps: the softmax is summed in 16 lanes.
FLAGS = (
  *build.FLAGS,
  "-fno-math-errno",
  "-fno-trapping-math",
  "-fassociative-math",
  "-fno-signed-zeros",
  "-ffp-contract=fast",
)


@functools.cache
def _load() -> str:
  """Builds, loads and registers the kernels; '' when they are ready, else why not."""
  if os.environ.get("TAPERNORM_CPU_ATTENTION", "1") == "0":
    return "disabled by TAPERNORM_CPU_ATTENTION=0"
  return build.register(
    SOURCE, TARGETS, FLAGS, without="training attends through `blocked` attention instead, more slowly"
  )


def reason() -> str:
  """Why the kernels are not used ('' when they are)."""
  return _load()


def available() -> bool:
  """Whether the kernels are built and registered (for CPU targets only: `cpu_kernels.attention_for` checks)."""
  return not reason()


def causal_attention(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array) -> Array:
  """Causal softmax attention of float32 B×T×H×K queries, keys and values (model/attention.py's contract)."""
  if not all(x.dtype == jnp.float32 for x in (q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)):
    raise ValueError(f"cpu_kernels.attention: float32 only, not {q_BxTxHxK.dtype}; use model.attention_impl")
  if not available():
    raise RuntimeError(f"cpu_kernels.attention: the kernels are not available ({reason()})")
  return attend_prescaled(q_BxTxHxK * jnp.float32(q_BxTxHxK.shape[-1] ** -0.5), k_BxTxHxK, v_BxTxHxK, "")


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def attend_prescaled(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, suffix: str = "") -> Array:
  """Attention of pre-scaled queries through the FFI targets `TARGETS` names, each followed by `suffix` (a second
  build registered beside the package's, as scripts/ab_attention.py does; '' for the package's own)."""
  return _forward(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, suffix)[0]


def _forward(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, suffix: str) -> tuple[Array, tuple]:
  """The output, and what the backward needs: the inputs, the output and each row's log-sum-exp (B×H×T)."""
  B, T, H, _ = q_BxTxHxK.shape
  shapes = (jax.ShapeDtypeStruct(q_BxTxHxK.shape, jnp.float32), jax.ShapeDtypeStruct((B, H, T), jnp.float32))
  out_BxTxHxK, lse_BxHxT = jax.ffi.ffi_call("tapernorm_attention_forward" + suffix, shapes)(
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK
  )
  return out_BxTxHxK, (q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, out_BxTxHxK, lse_BxHxT)


def _backward(suffix: str, saved: tuple, dout_BxTxHxK: Array) -> tuple[Array, Array, Array]:
  """(dq, dk, dv) from the saved forward and the output's cotangent."""
  shape = jax.ShapeDtypeStruct(dout_BxTxHxK.shape, jnp.float32)
  return tuple(jax.ffi.ffi_call("tapernorm_attention_backward" + suffix, (shape, shape, shape))(*saved, dout_BxTxHxK))


attend_prescaled.defvjp(_forward, _backward)
