"""KV-cache decoding: a preallocated cache, prefill, per-token decode and the sampling loop, all inside `jit`.

Prompts of different lengths come right-padded in one `B×P` array with their lengths `n_B`.
Cache slot `s` holds position `s`, so every row writes its own next slot: row b's prompt
fills slots 0…n_b − 1 (its padding lands beyond and is overwritten before it is ever
visible), and its i-th generated token goes to slot n_b + i. The attention mask only lets a
query at position p see slots ≤ p.

    logits_BxV, cache = prefill(variables, cfg, prompt_BxP, lengths_B, cache)
    logits_BxV, cache = decode_step(variables, cfg, tokens_B, index_B, cache)
    tokens_BxN = generate(variables, cfg, prompt_BxP, lengths_B, key, max_new_tokens=N)

Every function takes the model's `projection` (default: its own einsum); on CPU, decoding a few rows
passes the one `tapernorm_jax/cpu_kernels/few_rows.py` prepares with its variables. `mesh` (default: none)
is the mesh a sharded program is compiled for: the rows stay split over it (`Transformer(mesh=...)`).

Requests outside the model's domain are a ValueError naming the argument, raised while tracing
(the shapes and sampling settings are static): `temperature` < 0, `top_k` outside [0, V],
`max_new_tokens` < 1, a gpt2 request past its model.T learned positions, a chunk longer than
the cache. An llama (RoPE) request that runs past model.T, the context it was trained on, is
served with a warning that gives the counts, once per compiled shape.
"""

import functools
import logging
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from tapernorm_jax.model.kv_cache import LayerCache
from tapernorm_jax.model.config import ModelConfig
from tapernorm_jax.model.seams import Projection, einsum
from tapernorm_jax.model.transformer import Transformer

Array = jax.Array
PyTree = Any
Cache = list[LayerCache]
log = logging.getLogger(__name__)


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype: Any = None) -> Cache:
  """A zeroed cache of `length` slots per row: per layer {"k": BH×K×S, "v": BH×S×K}, BH = B·H (model/kv_cache.py)."""
  BH, K, dtype = batch * cfg.H, cfg.K, dtype or cfg.compute_dtype
  return [{"k": jnp.zeros((BH, K, length), dtype), "v": jnp.zeros((BH, length, K), dtype)} for _ in range(cfg.L)]


def cache_bytes(cache: Cache) -> int:
  """Bytes held by the cache (all of it is read by every decode step)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))


def prefill(
  variables: PyTree,
  cfg: ModelConfig,
  prompt_BxP: Array,
  lengths_B: Array,
  cache: Cache,
  gate: Array | float = 0.0,
  projection: Projection = einsum,
  mesh: Mesh | None = None,
) -> tuple[Array, Cache]:
  """Runs the (right-padded) prompts into the cache; returns the logits after each row's last prompt token."""
  model = Transformer(cfg, projection, mesh=mesh)
  index_B = jnp.zeros(prompt_BxP.shape[0], jnp.int32)
  h_BxPxD, cache = model.apply(variables, prompt_BxP, cache, index_B, gate, from_start=True, method=Transformer.decode)
  h_Bx1xD = jnp.take_along_axis(h_BxPxD, (lengths_B - 1)[:, None, None].astype(jnp.int32), axis=1)
  return model.apply(variables, h_Bx1xD, gate, method=Transformer.logits)[:, 0], cache


def decode_step(
  variables: PyTree,
  cfg: ModelConfig,
  tokens_B: Array,
  index_B: Array,
  cache: Cache,
  gate: Array | float = 0.0,
  projection: Projection = einsum,
  mesh: Mesh | None = None,
) -> tuple[Array, Cache]:
  """One token per row at position `index_B`; returns its next-token logits B×V and the updated cache."""
  model = Transformer(cfg, projection, mesh=mesh)
  h_Bx1xD, cache = model.apply(variables, tokens_B[:, None], cache, index_B, gate, method=Transformer.decode)
  return model.apply(variables, h_Bx1xD, gate, method=Transformer.logits)[:, 0], cache


def check_sampling(temperature: float, top_k: int, V: int) -> None:
  """Raises ValueError naming the argument unless `temperature` ≥ 0 (finite) and 0 ≤ `top_k` ≤ V."""
  if isinstance(temperature, jax.core.Tracer) or isinstance(top_k, jax.core.Tracer):
    raise ValueError("temperature and top_k must be Python numbers (static arguments), not traced values")
  if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
    raise ValueError(
      f"temperature={temperature!r}: must be a finite number >= 0 (0 is greedy; 1 samples the model's own distribution)"
    )
  if not isinstance(top_k, int) or not 0 <= top_k <= V:
    raise ValueError(
      f"top_k={top_k!r}: must be an integer in [0, {V}], the vocabulary size (0 samples among all tokens)"
    )


def sample(logits_BxV: Array, key: Array, temperature: float = 0.0, top_k: int = 0) -> Array:
  """Greedy when `temperature` is 0, else softmax(logits / temperature) sampling, over the top k when k > 0."""
  check_sampling(temperature, top_k, logits_BxV.shape[-1])
  if temperature == 0.0:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  logits_BxV = logits_BxV.astype(jnp.float32) / temperature
  if top_k > 0:
    top_logits_BxTopK, top_ids_BxTopK = jax.lax.top_k(logits_BxV, top_k)
    choice_B = jax.random.categorical(key, top_logits_BxTopK, axis=-1)
    return jnp.take_along_axis(top_ids_BxTopK, choice_B[:, None], axis=-1)[:, 0].astype(jnp.int32)
  return jax.random.categorical(key, logits_BxV, axis=-1).astype(jnp.int32)


def decode_loop(
  variables: PyTree,
  cfg: ModelConfig,
  first_B: Array,
  lengths_B: Array,
  cache: Cache,
  key: Array,
  max_new_tokens: int,
  temperature: float = 0.0,
  top_k: int = 0,
  eos_id: int | None = None,
  gate: Array | float = 0.0,
  projection: Projection = einsum,
) -> Array:
  """Given each row's first new token, generates the rest with `lax.while_loop`; returns tokens B×N."""
  B, N = first_B.shape[0], max_new_tokens
  done_B = jnp.zeros(B, bool) if eos_id is None else first_B == eos_id
  out_BxN = jnp.zeros((B, N), jnp.int32).at[:, 0].set(first_B)

  def keep_going(state) -> Array:
    i, _, _, _, _, done_B = state
    return (i < N) & ~jnp.all(done_B)

  def step(state):
    i, out_BxN, cache, tokens_B, key, done_B = state
    logits_BxV, cache = decode_step(variables, cfg, tokens_B, lengths_B + i - 1, cache, gate, projection)
    key, sub = jax.random.split(key)
    tokens_B = sample(logits_BxV, sub, temperature, top_k)
    if eos_id is not None:
      tokens_B = jnp.where(done_B, eos_id, tokens_B)
      done_B = done_B | (tokens_B == eos_id)
    return i + 1, out_BxN.at[:, i].set(tokens_B), cache, tokens_B, key, done_B

  state = (jnp.int32(1), out_BxN, cache, first_B, key, done_B)
  _, out_BxN, _, _, _, done_B = jax.lax.while_loop(keep_going, step, state)
  if eos_id is not None:  # after a row's first EOS (and after an early stop of the whole batch): EOS
    out_BxN = jnp.where(jnp.cumsum(out_BxN == eos_id, axis=1) > 0, eos_id, out_BxN)
  return out_BxN


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "temperature", "top_k", "eos_id", "projection"))
def generate(
  variables: PyTree,
  cfg: ModelConfig,
  prompt_BxP: Array,
  lengths_B: Array,
  key: Array,
  *,
  max_new_tokens: int,
  temperature: float = 0.0,
  top_k: int = 0,
  eos_id: int | None = None,
  gate: Array | float = 0.0,
  projection: Projection = einsum,
) -> Array:
  """Prefill plus `max_new_tokens − 1` decode steps in one compiled function; returns the new tokens B×N."""
  check_sampling(temperature, top_k, cfg.V)
  check_lengths(cfg, prompt_BxP.shape[1], max_new_tokens)
  cache = init_cache(cfg, prompt_BxP.shape[0], cache_length(prompt_BxP.shape[1], max_new_tokens))
  logits_BxV, cache = prefill(variables, cfg, prompt_BxP, lengths_B, cache, gate, projection)
  key, sub = jax.random.split(key)
  first_B = sample(logits_BxV, sub, temperature, top_k)
  return decode_loop(
    variables, cfg, first_B, lengths_B, cache, key, max_new_tokens, temperature, top_k, eos_id, gate, projection
  )


def cache_length(prompt_length: int, max_new_tokens: int) -> int:
  """Slots needed: the longest prompt plus every generated token but the last (which is never fed back)."""
  return prompt_length + max_new_tokens - 1


def check_lengths(cfg: ModelConfig, prompt_length: int, max_new_tokens: int) -> None:
  """Raises ValueError if a request cannot be served (learned positions stop at cfg.T); warns when an llama request
  runs past cfg.T, the context its RoPE model was trained on."""
  if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be an integer >= 1")
  if prompt_length < 1:
    raise ValueError(f"prompt length {prompt_length}: every prompt needs at least one token")
  last = prompt_length + max_new_tokens - 1  # positions 0 … last − 1 are fed to the model
  if cfg.family == "gpt2" and last > cfg.T:
    raise ValueError(
      f"max_new_tokens={max_new_tokens}: a prompt of {prompt_length} tokens + max_new_tokens − 1 = "
      f"{last} exceeds model.T={cfg.T}, the learned positions of a gpt2 model; lower max_new_tokens to "
      f"<= {cfg.T - prompt_length + 1} or shorten the prompt"
      if prompt_length <= cfg.T
      else f"prompt length {prompt_length} exceeds model.T={cfg.T}, the learned positions of a gpt2 "
      "model; shorten the prompt"
    )
  if cfg.family == "llama" and last > cfg.T:
    log.warning(
      "decoding positions 0…%d (a prompt of %d tokens + %d new), past the model.T=%d positions this RoPE "
      "model was trained on; what comes after position %d is extrapolation and usually degrades",
      last - 1,
      prompt_length,
      max_new_tokens,
      cfg.T,
      cfg.T - 1,
    )


def pad_prompts(prompts: list[list[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token lists into (prompt_BxP, lengths_B)."""
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("every prompt needs at least one token")
  P = max(len(p) for p in prompts)
  prompt_BxP = np.full((len(prompts), P), pad_id, np.int32)
  for b, p in enumerate(prompts):
    prompt_BxP[b, : len(p)] = p
  return prompt_BxP, np.asarray([len(p) for p in prompts], np.int32)


def trim(tokens_BxN: np.ndarray, eos_id: int | None) -> list[list[int]]:
  """Generated tokens per row, cut after the first EOS (kept)."""
  rows = []
  for row in np.asarray(tokens_BxN).tolist():
    rows.append(row[: row.index(eos_id) + 1] if eos_id is not None and eos_id in row else row)
  return rows
