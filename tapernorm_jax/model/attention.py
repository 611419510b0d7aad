"""Causal self-attention behind one config field, `model.attention_impl` (docs/method.md §13).

    xla       the reference: a full T×T score tensor per head, the upper triangle masked
              (`jax.nn.dot_product_attention(implementation="xla")`).
    blocked   causal attention in query blocks (`blocked_plan`): block i scores only the keys it
              can see (i + 1 blocks), so fully masked blocks are never computed, and as many
              (batch, head) pairs go at once as keep one block row of scores in the cores' L2
              cache (`lax.map` over the groups when they do not all fit). Plain `lax`, so it
              differentiates; the CPU default.
    cudnn     cuDNN's fused kernel through `jax.nn.dot_product_attention` (GPU, bf16/fp16).
    splash    the Pallas splash-attention kernel that ships with jax (TPU), for lengths that are a
              multiple of its 128-row blocks (others, e.g. short prefills, use xla). Off TPU it runs
              in Pallas interpret mode, with a warning: correct and slow, which is how it is tested.
    auto      blocked on CPU; cudnn on GPU for bf16/fp16 (else xla);
              splash on TPU when T is a multiple of its 128-row blocks (else xla).

Every implementation takes and returns `B×T×H×K` arrays, computes the softmax in fp32 and is
tested against `xla` (outputs and gradients) in tests/model/test_attention.py.
"""

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
IMPLS = ("auto", "xla", "blocked", "cudnn", "splash")
BLOCK = 128  # the block size of `splash` (its minimum)
SCORES_BYTES = 2 * 2**20  # fp32 scores of one query block of `blocked`, all pairs of a step: ~L2 of two cores
MAX_BLOCKS = 8  # query blocks per pair in `blocked` (each is a handful of ops; more cost more than they skip)


def resolve(impl: str | None, dtype: jnp.dtype, T: int, backend: str | None = None) -> str:
  """The implementation `auto` (or None) stands for on `backend` (default: jax's), for this dtype and length."""
  if impl not in (None, "auto"):
    return impl
  backend = backend or jax.default_backend()
  if backend == "cpu":
    return "blocked"
  if backend in ("gpu", "cuda", "rocm"):
    return "cudnn" if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and backend != "rocm" else "xla"
  if backend == "tpu":
    return "splash" if T % BLOCK == 0 else "xla"
  return "xla"


def causal_attention(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, impl: str | None = "auto") -> Array:
  """Causal softmax attention of every position over the positions ≤ it, through `impl`."""
  impl = resolve(impl, q_BxTxHxK.dtype, q_BxTxHxK.shape[1])
  backend = jax.default_backend()
  if impl == "xla":
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, is_causal=True, implementation="xla")
  if impl == "blocked":
    return blocked_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)
  if impl == "cudnn":
    if backend != "gpu" or q_BxTxHxK.dtype not in (jnp.bfloat16, jnp.float16):
      raise ValueError(f"model.attention_impl='cudnn' needs an NVIDIA GPU and bf16/fp16 activations, not {backend} "
                       f"with {q_BxTxHxK.dtype}; use model.attention_impl=auto")
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, is_causal=True, implementation="cudnn")
  if impl == "splash":
    if q_BxTxHxK.shape[1] % BLOCK:  # splash tiles whole 128-row blocks; shorter or ragged chunks (prefills) use xla
      return causal_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, "xla")
    if backend != "tpu":
      warnings.warn(f"model.attention_impl='splash' on {backend}: running the TPU kernel in Pallas interpret mode "
                    "(correct but slow; meant for tests)", stacklevel=2)
    return splash_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, interpret=backend != "tpu")
  raise ValueError(f"model.attention_impl={impl!r}: choose one of {IMPLS}")


def blocked_plan(pairs: int, T: int) -> tuple[int, int]:
  """(query rows per block, (batch, head) pairs per step) of `blocked` for `pairs` = B·H sequences of length T.

  Blocks of max(32, T / MAX_BLOCKS) rows; pairs per step: the largest divisor of B·H whose block row of fp32
  scores (pairs × block × T) fits in SCORES_BYTES, at least one. In isolation on a 2-core x86 CPU, at B·H = 16–64,
  this is 1.3–2.0× faster than 128-row blocks of 2 pairs for T ≤ 256 (equal at 512), and 1.4–3.7× than `xla`.
  """
  block = max(32, -(-T // MAX_BLOCKS))
  fits = max(1, SCORES_BYTES // (4 * block * T))
  return block, max(n for n in range(1, min(pairs, fits) + 1) if pairs % n == 0)


def blocked_attention(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, block: int | None = None,
                      heads_per_step: int | None = None) -> Array:
  """Causal attention in query blocks that score only the keys they see, a group of (batch, head) pairs at a time.

  `block` and `heads_per_step` default to `blocked_plan`'s; a `heads_per_step` that does not divide B·H is
  lowered to their greatest common divisor, so every step has the same shape.
  """
  B, T, H, K = q_BxTxHxK.shape
  plan_block, plan_pairs = blocked_plan(B * H, T)
  block, n = block or plan_block, math.gcd(B * H, heads_per_step or plan_pairs)
  to_StepsxNxTxK = lambda x: jnp.swapaxes(x, 1, 2).reshape(B * H // n, n, T, K)
  q_StepsxNxTxK = to_StepsxNxTxK(q_BxTxHxK * jnp.asarray(K**-0.5, q_BxTxHxK.dtype))
  qkv = (q_StepsxNxTxK, to_StepsxNxTxK(k_BxTxHxK), to_StepsxNxTxK(v_BxTxHxK))
  if n == B * H:  # one step: no loop around it
    out_StepsxNxTxK = _causal_blocks(*(x[0] for x in qkv), block)[None]
  else:
    out_StepsxNxTxK = jax.lax.map(lambda qkv: _causal_blocks(*qkv, block), qkv)
  return jnp.swapaxes(out_StepsxNxTxK.reshape(B, H, T, K), 1, 2)


def _causal_blocks(q_NxTxK: Array, k_NxTxK: Array, v_NxTxK: Array, block: int) -> Array:
  """Causal attention of N independent (batch, head) pairs (queries pre-scaled), one query block at a time."""
  T = q_NxTxK.shape[1]
  outs = []
  for start in range(0, T, block):
    end = min(start + block, T)  # this block's queries see keys 0 … end − 1; only the diagonal block is masked
    scores_NxQxS = jnp.einsum("nqk,nsk->nqs", q_NxTxK[:, start:end], k_NxTxK[:, :end],
                              preferred_element_type=jnp.float32)
    visible_QxS = np.arange(end)[None, :] <= np.arange(start, end)[:, None]
    scores_NxQxS = jnp.where(visible_QxS, scores_NxQxS, jnp.finfo(jnp.float32).min)
    weights_NxQxS = jnp.exp(scores_NxQxS - scores_NxQxS.max(axis=-1, keepdims=True))
    total_NxQx1 = weights_NxQxS.sum(axis=-1, keepdims=True)
    out_NxQxK = jnp.einsum("nqs,nsk->nqk", weights_NxQxS.astype(v_NxTxK.dtype), v_NxTxK[:, :end],
                           preferred_element_type=jnp.float32)
    outs.append((out_NxQxK / total_NxQx1).astype(q_NxTxK.dtype))
  return jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]


@functools.lru_cache(maxsize=32)
def _splash_kernel(H: int, T: int, interpret: bool):
  """A causal splash-attention kernel for H heads of length T (mask tables are built once per shape)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

  mask = masks.MultiHeadMask([masks.CausalMask((T, T)) for _ in range(H)])
  b = BLOCK
  sizes = splash.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                            block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, interpret: bool = False) -> Array:
  """Causal attention through the Pallas splash kernel (TPU; any backend with `interpret`)."""
  B, T, H, K = q_BxTxHxK.shape
  if T % BLOCK:
    raise ValueError(f"splash attention tiles {BLOCK}-row blocks, but T={T}; use causal_attention (it falls back to "
                     "xla for such lengths)")
  kernel = _splash_kernel(H, T, interpret)
  to_BxHxTxK = lambda x: jnp.swapaxes(x, 1, 2)
  scaled_BxHxTxK = to_BxHxTxK(q_BxTxHxK * jnp.asarray(K**-0.5, q_BxTxHxK.dtype))
  out_BxHxTxK = jax.vmap(kernel)(scaled_BxHxTxK, to_BxHxTxK(k_BxTxHxK), to_BxHxTxK(v_BxTxHxK))
  return to_BxHxTxK(out_BxHxTxK).astype(q_BxTxHxK.dtype)
