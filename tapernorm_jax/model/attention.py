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
              multiple of its 128-row blocks (others, e.g. short prefills, use xla). For a target
              other than TPU it runs in Pallas interpret mode, with a warning: correct and slow, which
              is how it is tested.
    auto      blocked for a CPU target; cudnn for a GPU target in bf16/fp16 (else xla);
              splash for a TPU target when T is a multiple of its 128-row blocks (else xla).

Every choice follows the *target* platform (the devices the program is compiled for, `ModelConfig.platform`),
never the host's backend: a program built for a TPU mesh on a CPU host is the TPU program.

Every implementation takes and returns `B×T×H×K` arrays, computes the softmax in fp32 and is
tested against `xla` (outputs and gradients) in tests/model/test_attention.py.
"""

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from tapernorm_jax.model import sharding

Array = jax.Array
IMPLS = ("auto", "xla", "blocked", "cudnn", "splash")
BLOCK = 128  # the block size of `splash` (its minimum)
SCORES_BYTES = 2 * 2**20  # fp32 scores of one query block of `blocked`, all pairs of a step: ~L2 of two cores
MAX_BLOCKS = 8  # query blocks per pair in `blocked` (each is a handful of ops; more cost more than they skip)


def resolve(impl: str | None, dtype: jnp.dtype, T: int, platform: str) -> str:
  """The implementation `auto` (or None) stands for on a `platform` target (`cpu`, `gpu`, `tpu`), for this dtype
  and length."""
  if impl not in (None, "auto"):
    return impl
  if platform == "cpu":
    return "blocked"
  if platform == "gpu":
    return "cudnn" if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else "xla"
  if platform == "tpu":
    return "splash" if T % BLOCK == 0 else "xla"
  return "xla"


def causal_attention(
  q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, impl: str | None, platform: str, mesh: Mesh | None = None
) -> Array:
  """Causal softmax attention of every position over the positions ≤ it, through `impl` on a `platform` target;
  the splash kernel runs on each device's rows of `mesh` (a Mosaic call cannot be split by XLA)."""
  impl = resolve(impl, q_BxTxHxK.dtype, q_BxTxHxK.shape[1], platform)
  if impl == "xla":
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, is_causal=True, implementation="xla")
  if impl == "blocked":
    return blocked_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)
  if impl == "cudnn":
    if platform != "gpu" or q_BxTxHxK.dtype not in (jnp.bfloat16, jnp.float16):
      raise ValueError(
        f"model.attention_impl='cudnn' needs an NVIDIA GPU target and bf16/fp16 activations, not "
        f"{platform} with {q_BxTxHxK.dtype}; use model.attention_impl=auto"
      )
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, is_causal=True, implementation="cudnn")
  if impl == "splash":
    if q_BxTxHxK.shape[1] % BLOCK:  # splash tiles whole 128-row blocks; shorter or ragged chunks (prefills) use xla
      return causal_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, "xla", platform)
    if platform != "tpu":
      warnings.warn(
        f"model.attention_impl='splash' for a {platform} target: running the TPU kernel in Pallas "
        "interpret mode (correct but slow; meant for tests)",
        stacklevel=2,
      )
    splash = functools.partial(splash_attention, interpret=platform != "tpu")
    return sharding.per_device(splash, mesh)(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)
  raise ValueError(f"model.attention_impl={impl!r}: choose one of {IMPLS}")


def blocked_plan(pairs: int, T: int, scores_bytes: int = SCORES_BYTES) -> tuple[int, int]:
  """(query rows per block, (batch, head) pairs per step) of `blocked` for `pairs` = B·H sequences of length T.

  Blocks of max(32, T / MAX_BLOCKS) rows; pairs per step: the largest divisor of B·H whose block row of fp32
  scores (pairs × block × T) fits in `scores_bytes`, at least one. In isolation on a 2-core x86 CPU, at B·H = 16–64,
  this is 1.3–2.0× faster than 128-row blocks of 2 pairs for T ≤ 256 (equal at 512), and 1.4–3.7× than `xla`.
  """
  block = max(32, -(-T // MAX_BLOCKS))
  fits = max(1, scores_bytes // (4 * block * T))
  return block, max(n for n in range(1, min(pairs, fits) + 1) if pairs % n == 0)


def blocked_attention(
  q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, block: int | None = None, heads_per_step: int | None = None
) -> Array:
  """Causal attention in query blocks that score only the keys they see, a group of (batch, head) pairs at a time.

  `block` and `heads_per_step` default to `blocked_plan`'s; a `heads_per_step` that does not divide B·H is
  lowered to their greatest common divisor, so every step has the same shape. The backward pass is written out
  (`_blocked`'s VJP): it recomputes each block's softmax from the saved log-sum-exp, in groups of a quarter of the
  forward's pairs (it holds four score-sized arrays per block), instead of differentiating through the forward.
  """
  B, T, H, K = q_BxTxHxK.shape
  plan_block, plan_pairs = blocked_plan(B * H, T)
  block = block or plan_block
  n = math.gcd(B * H, heads_per_step or plan_pairs)
  n_backward = math.gcd(B * H, heads_per_step or blocked_plan(B * H, T, SCORES_BYTES // 4)[1])
  to_NxTxK = lambda x: jnp.swapaxes(x, 1, 2).reshape(B * H, T, K)
  out_NxTxK = _blocked(
    to_NxTxK(q_BxTxHxK * jnp.asarray(K**-0.5, q_BxTxHxK.dtype)),
    to_NxTxK(k_BxTxHxK),
    to_NxTxK(v_BxTxHxK),
    block,
    n,
    n_backward,
  )
  return jnp.swapaxes(out_NxTxK.reshape(B, H, T, K), 1, 2)


def _in_groups(fn, n: int, *xs_NxTx_: Array):
  """`fn` over groups of `n` pairs (the leading axis), one group after another (`lax.map`) unless all fit in one."""
  N = xs_NxTx_[0].shape[0]
  if n >= N:
    return fn(*xs_NxTx_)
  grouped = jax.lax.map(lambda xs: fn(*xs), tuple(x.reshape(N // n, n, *x.shape[1:]) for x in xs_NxTx_))
  return jax.tree.map(lambda y: y.reshape(N, *y.shape[2:]), grouped)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _blocked(q_NxTxK: Array, k_NxTxK: Array, v_NxTxK: Array, block: int, n: int, n_backward: int) -> Array:
  """Causal attention of N (batch, head) pairs, queries pre-scaled, `n` pairs at a time."""
  return _in_groups(lambda *qkv: _forward_blocks(*qkv, block), n, q_NxTxK, k_NxTxK, v_NxTxK)[0]


def _blocked_forward(q_NxTxK, k_NxTxK, v_NxTxK, block, n, n_backward):
  """The forward pass, keeping what the backward needs: the inputs, the output and each row's log-sum-exp."""
  out_NxTxK, lse_NxT = _in_groups(lambda *qkv: _forward_blocks(*qkv, block), n, q_NxTxK, k_NxTxK, v_NxTxK)
  return out_NxTxK, (q_NxTxK, k_NxTxK, v_NxTxK, out_NxTxK, lse_NxT)


def _blocked_backward(block, n, n_backward, saved, dout_NxTxK):
  """(dq, dk, dv), `n_backward` pairs at a time."""
  return _in_groups(lambda *args: _backward_blocks(*args, block), n_backward, *saved, dout_NxTxK)


_blocked.defvjp(_blocked_forward, _blocked_backward)


def _visible(start: int, end: int) -> np.ndarray:
  """Q×S: which of keys 0 … end − 1 the queries start … end − 1 see."""
  return np.arange(end)[None, :] <= np.arange(start, end)[:, None]


def _forward_blocks(q_NxTxK: Array, k_NxTxK: Array, v_NxTxK: Array, block: int) -> tuple[Array, Array]:
  """(output, fp32 log-sum-exp of each row's scores) of N pairs, one query block at a time."""
  T = q_NxTxK.shape[1]
  outs, lses = [], []
  for start in range(0, T, block):
    end = min(start + block, T)  # this block's queries see keys 0 … end − 1; only the diagonal block is masked
    scores_NxQxS = jnp.einsum(
      "nqk,nsk->nqs", q_NxTxK[:, start:end], k_NxTxK[:, :end], preferred_element_type=jnp.float32
    )
    scores_NxQxS = jnp.where(_visible(start, end), scores_NxQxS, jnp.finfo(jnp.float32).min)
    max_NxQx1 = scores_NxQxS.max(axis=-1, keepdims=True)
    weights_NxQxS = jnp.exp(scores_NxQxS - max_NxQx1)
    total_NxQx1 = weights_NxQxS.sum(axis=-1, keepdims=True)
    out_NxQxK = jnp.einsum(
      "nqs,nsk->nqk", weights_NxQxS.astype(v_NxTxK.dtype), v_NxTxK[:, :end], preferred_element_type=jnp.float32
    )
    outs.append((out_NxQxK / total_NxQx1).astype(q_NxTxK.dtype))
    lses.append((max_NxQx1 + jnp.log(total_NxQx1))[..., 0])
  join = lambda xs: jnp.concatenate(xs, axis=1) if len(xs) > 1 else xs[0]
  return join(outs), join(lses)


def _backward_blocks(
  q_NxTxK: Array, k_NxTxK: Array, v_NxTxK: Array, out_NxTxK: Array, lse_NxT: Array, dout_NxTxK: Array, block: int
) -> tuple[Array, Array, Array]:
  """(dq, dk, dv) of N pairs, one query block at a time, from the softmax recomputed as exp(scores − lse)."""
  dtypes = (q_NxTxK.dtype, k_NxTxK.dtype, v_NxTxK.dtype)
  f32 = lambda x: x.astype(jnp.float32)
  q_NxTxK, k_NxTxK, v_NxTxK, dout_NxTxK = f32(q_NxTxK), f32(k_NxTxK), f32(v_NxTxK), f32(dout_NxTxK)
  T = q_NxTxK.shape[1]
  rowdot_NxT = jnp.sum(dout_NxTxK * f32(out_NxTxK), axis=-1)  # Σ_s p·dp of each row
  dqs, dk_NxTxK, dv_NxTxK = [], jnp.zeros_like(k_NxTxK), jnp.zeros_like(v_NxTxK)
  for start in range(0, T, block):
    end = min(start + block, T)
    q_NxQxK, dout_NxQxK = q_NxTxK[:, start:end], dout_NxTxK[:, start:end]
    scores_NxQxS = jnp.einsum("nqk,nsk->nqs", q_NxQxK, k_NxTxK[:, :end])
    weights_NxQxS = jnp.where(_visible(start, end), jnp.exp(scores_NxQxS - lse_NxT[:, start:end, None]), 0.0)
    dv_NxTxK = dv_NxTxK.at[:, :end].add(jnp.einsum("nqs,nqk->nsk", weights_NxQxS, dout_NxQxK))
    dweights_NxQxS = jnp.einsum("nqk,nsk->nqs", dout_NxQxK, v_NxTxK[:, :end])
    dscores_NxQxS = weights_NxQxS * (dweights_NxQxS - rowdot_NxT[:, start:end, None])
    dqs.append(jnp.einsum("nqs,nsk->nqk", dscores_NxQxS, k_NxTxK[:, :end]))
    dk_NxTxK = dk_NxTxK.at[:, :end].add(jnp.einsum("nqs,nqk->nsk", dscores_NxQxS, q_NxQxK))
  dq_NxTxK = jnp.concatenate(dqs, axis=1) if len(dqs) > 1 else dqs[0]
  return tuple(d.astype(dtype) for d, dtype in zip((dq_NxTxK, dk_NxTxK, dv_NxTxK), dtypes, strict=True))


@functools.lru_cache(maxsize=32)
def _splash_kernel(H: int, T: int, interpret: bool):
  """A causal splash-attention kernel for H heads of length T (mask tables are built once per shape)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

  mask = masks.MultiHeadMask([masks.CausalMask((T, T)) for _ in range(H)])
  b = BLOCK
  sizes = splash.BlockSizes(
    block_q=b,
    block_kv=b,
    block_kv_compute=b,
    block_q_dkv=b,
    block_kv_dkv=b,
    block_kv_dkv_compute=b,
    block_q_dq=b,
    block_kv_dq=b,
  )
  return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q_BxTxHxK: Array, k_BxTxHxK: Array, v_BxTxHxK: Array, interpret: bool = False) -> Array:
  """Causal attention through the Pallas splash kernel (TPU; any backend with `interpret`)."""
  B, T, H, K = q_BxTxHxK.shape
  if T % BLOCK:
    raise ValueError(
      f"splash attention tiles {BLOCK}-row blocks, but T={T}; use causal_attention (it falls back to "
      "xla for such lengths)"
    )
  kernel = _splash_kernel(H, T, interpret)
  to_BxHxTxK = lambda x: jnp.swapaxes(x, 1, 2)
  scaled_BxHxTxK = to_BxHxTxK(q_BxTxHxK * jnp.asarray(K**-0.5, q_BxTxHxK.dtype))
  out_BxHxTxK = jax.vmap(kernel)(scaled_BxHxTxK, to_BxHxTxK(k_BxTxHxK), to_BxHxTxK(v_BxTxHxK))
  return to_BxHxTxK(out_BxHxTxK).astype(q_BxTxHxK.dtype)
