"""The KV cache's layout and mechanics: one `{"k": BH×K×S, "v": BH×S×K}` dict per layer, written in place per row,
read by attention that masks the slots a query may not see (`Transformer.decode` uses them; slot = position)."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from tapernorm_jax.model import sharding

Array = jax.Array
# {"k": BH×K×S, "v": BH×S×K}, rows BH = B·H (row b, head h at b·H + h); slot s holds position s. This is
# how the two attention matmuls read them (one batch axis, then contracted, then kept). Any other layout
# costs XLA:CPU a copy of the whole cache per layer and decode step: a transposed copy for other axis
# orders, and for separate B and H axes (merged by a reshape before the matmul) a duplicated in-place
# update inside the decode loop.
LayerCache = dict[str, Array]


def write_cache(cache: Array, new_BxTxHxK: Array, index_B: Array, keys: bool, mesh: Mesh | None = None) -> Array:
  """Writes row b's T entries at slots index_B[b] … + T − 1 of a key (BH×K×S) or value (BH×S×K) cache; on `mesh`,
  each device writes its own rows (a per-row update of a split cache would otherwise move every row between
  devices: one collective per row and layer, and a compile whose size grows with rows × devices)."""
  write = functools.partial(_write_rows, keys=keys)
  return sharding.per_device(write, mesh)(new_BxTxHxK, index_B, cache)


def _write_rows(new_BxTxHxK: Array, index_B: Array, cache: Array, keys: bool) -> Array:
  """`write_cache` on one device's rows."""
  B, T, H, K = new_BxTxHxK.shape
  new_BxHxLxK = jnp.swapaxes(new_BxTxHxK, 1, 2).astype(cache.dtype)
  zero = jnp.zeros((), index_B.dtype)
  for b in range(B):  # one in-place update per row (a vmapped update is a scatter, copied whole per step)
    if keys:
      cache = jax.lax.dynamic_update_slice(cache, jnp.swapaxes(new_BxHxLxK[b], 1, 2), (b * H, zero, index_B[b]))
    else:
      cache = jax.lax.dynamic_update_slice(cache, new_BxHxLxK[b], (b * H, index_B[b], zero))
  return cache


def cached_attention(q_BxTxHxK: Array, k_BHxKxS: Array, v_BHxSxK: Array, positions_BxT: Array) -> Array:
  """Softmax attention (fp32 scores) of T queries over the cache; a query at position p sees slots ≤ p."""
  B, T, H, K = q_BxTxHxK.shape
  S = k_BHxKxS.shape[-1]
  q_BHxTxK = jnp.swapaxes(q_BxTxHxK, 1, 2).reshape(B * H, T, K)
  scores_BHxTxS = jnp.einsum("nlk,nks->nls", q_BHxTxK, k_BHxKxS).astype(jnp.float32) * K**-0.5
  visible_BHxTxS = jnp.arange(S)[None, None, :] <= jnp.repeat(positions_BxT, H, axis=0)[:, :, None]
  scores_BHxTxS = jnp.where(visible_BHxTxS, scores_BHxTxS, jnp.finfo(jnp.float32).min)
  probs_BHxTxS = jax.nn.softmax(scores_BHxTxS, axis=-1).astype(v_BHxSxK.dtype)
  out_BHxTxK = jnp.einsum("nls,nsk->nlk", probs_BHxTxS, v_BHxSxK)
  return jnp.swapaxes(out_BHxTxK.reshape(B, H, T, K), 1, 2)


def check_cache_write(cfg: Any, Q: int, S: int, index_B: Array) -> None:
  """Raises ValueError unless Q tokens per row fit the S-slot cache: at trace time from the static shapes, and also
  from `index_B` when it is concrete (under jit it is traced, and an index past the end would be clamped silently)."""
  if Q > S:
    raise ValueError(
      f"tokens_BxQ has {Q} tokens per row but the cache has only {S} slots (slot = position); allocate a longer cache"
    )
  if cfg.family == "gpt2" and S > cfg.T:
    raise ValueError(
      f"the cache has {S} slots but a gpt2 model has model.T={cfg.T} learned positions; allocate at most {cfg.T} slots"
    )
  if not isinstance(index_B, jax.core.Tracer):
    index = np.asarray(index_B)
    if index.size and (index.min() < 0 or index.max() + Q > S):
      raise ValueError(
        f"index_B={index.tolist()}: writing {Q} token(s) from slot {int(index.max())} runs past the "
        f"cache's {S} slots (slots 0…{S - 1}); allocate a longer cache (decode.init_cache)"
        if index.min() >= 0
        else f"index_B={index.tolist()}: cache slots start at 0"
      )
