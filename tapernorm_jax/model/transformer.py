"""The decoder-only pre-norm transformer: `llama` (RoPE, SwiGLU, RMS) and `gpt2` (learned positions, GELU, LN).

Shape letters: B batch, T sequence length (model.T the longest), D width, H heads, K = D/H head
width, F MLP width, V vocabulary, S cache slots, BH cache rows (B·H). `cfg.L` is the number of
layers. Variable names and paths come from `param_paths.py`.

`Transformer(cfg).apply(variables, tokens_BxT, gate=g)` returns logits `B×T×V`; with
`return_hidden=True` it returns `(logits_BxTxV, h_BxTxD)`, `h` being the pre-logit residual
stream (the input of the final norm). Parameters carry logical axis names (see
`sharding.py`); the gate is a (traced) scalar shared by every tapered norm, or a `gates.Gates` with one gate per
norm position read by name (each block's attention and MLP norms, the final norm, and optionally each attention
norm's value path, where queries and keys keep the attention norm's own gate).

With `model.scan_layers` the forward (`hidden`, so `__call__`, training and evaluation) runs the L blocks as one
block under a scan over their variables stacked inside the call (`layer_scan.py`): one compiled body, the same tree,
numbers and batch statistics; `init`, `last_hidden` and `decode` stay unrolled. `model.remat` is the policy each
block is rematerialized with in either form.

`Transformer.decode` is the KV-cache path used by `decode.py`: it runs Q new tokens per row
at per-row offsets, writes their keys and values into a preallocated cache (one
`{"k": BH×K×S, "v": BH×S×K}` dict per layer; slot = position) and returns the new pre-logit
states with the updated cache.

Every linear map goes through one seam, `Transformer(cfg, projection=...)` (default: `einsum`), so a
backend-specific product (a CPU kernel for decoding a few rows) is chosen by the caller and never by a
backend check in here. What `dtype=auto` and `attention_impl=auto` stand for follows `cfg.platform`, the
target the caller compiles for. `Transformer(cfg, mesh=...)` keeps the activations' batch split over
every axis of the mesh at the block boundaries (`sharding.constrain`), so each device computes its rows.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from tapernorm_jax.model import layer_scan, param_paths, sharding
from tapernorm_jax.model.gates import BlockGates, Gates, as_gates
from tapernorm_jax.model.kv_cache import LayerCache, check_cache_write
from tapernorm_jax.model.config import ModelConfig
from tapernorm_jax.model.layers import Attention, Mlp
from tapernorm_jax.model.norms import CALIB_STATS, Norm, ScaleMonitor
from tapernorm_jax.model.seams import Attend, Projection, einsum

Array = jax.Array


class Block(nn.Module):
  """Pre-norm block: h + Attn(NormA(h)), then + MLP(NormM(h))."""

  cfg: ModelConfig
  projection: Projection = einsum
  attend: Attend | None = None
  mesh: Mesh | None = None

  @nn.compact
  def __call__(
    self,
    h_BxTxD: Array,
    positions_BxT: Array,
    gates: BlockGates,
    cache: LayerCache | None = None,
    index_B: Array | None = None,
    from_start: bool = False,
    last_only: bool = False,
  ) -> Array | tuple[Array, LayerCache]:
    """One residual block (the gates of its attention and MLP norms, and of the attention norm's value path where
    `gates` has one); with `cache` also returns its updated KV cache.

    `last_only` returns the last position only (B×1×D): its attention and MLP run on that position alone.
    `from_start` and `last_only` are passed by position (static arguments under `nn.remat`).
    """
    cfg = self.cfg
    norm = lambda name, position: Norm(
      cfg.norm_kind,
      cfg.internal_norm,
      cfg.eps,
      cfg.compute_dtype,
      cfg.param_dtype,
      cfg.alpha_init(position),
      cfg.derf_shift,
      cfg.norm_gain_init,
      cfg.repbn_gain_init,
      name=name,
    )
    x_v_BxTxD = None
    if gates.attn_value is not None:  # the value path has its own gate: the norm's two blends of one normalization
      x_BxTxD, x_v_BxTxD = norm(param_paths.ATTN_NORM, 0)(h_BxTxD, gates.attn, gates.attn_value)
    else:
      x_BxTxD = norm(param_paths.ATTN_NORM, 0)(h_BxTxD, gates.attn)
    attn = Attention(cfg, self.projection, self.attend, self.mesh, name=param_paths.ATTN)(
      x_BxTxD, positions_BxT, cache, index_B, from_start=from_start, last_only=last_only, x_v_BxTxD=x_v_BxTxD
    )
    attn_BxTxD, cache = attn if cache is not None else (attn, None)
    h_BxTxD = (h_BxTxD[:, -1:] if last_only else h_BxTxD) + attn_BxTxD
    mlp = Mlp(cfg, self.projection, name=param_paths.MLP)
    h_BxTxD = h_BxTxD + mlp(norm(param_paths.MLP_NORM, 1)(h_BxTxD, gates.mlp))
    return h_BxTxD if cache is None else (h_BxTxD, cache)


class Transformer(nn.Module):
  """Decoder-only pre-norm transformer; `cfg` may be a ModelConfig, a dict or a ConfigDict."""

  cfg: Any
  projection: Projection = einsum  # the seam for backend-specific products (see Projection)
  attend: Attend | None = None  # the seam for a backend's own causal attention (see Attend)
  mesh: Mesh | None = None  # the mesh the program is compiled for: activations keep their batch split over it

  def __post_init__(self):
    object.__setattr__(self, "cfg", ModelConfig.from_config(self.cfg))
    super().__post_init__()

  def setup(self):  # attribute names are the layout's: embed, pos_embed, final_norm, pre_logit, head, logits_bias
    cfg = self.cfg
    block = Block
    if cfg.remat != "none":  # static arguments (self is 0): from_start, last_only
      block = nn.remat(Block, static_argnums=(6, 7), policy=layer_scan.remat_policy(cfg.remat))
    self.embed = self.param(
      param_paths.EMBED,
      nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), ("vocab", "embed")),
      (cfg.V, cfg.D),
      cfg.param_dtype,
    )
    if cfg.family == "gpt2":
      self.pos_embed = self.param(
        param_paths.POS_EMBED,
        nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std / 2), (None, "embed")),
        (cfg.T, cfg.D),
        cfg.param_dtype,
      )
    self.blocks = [block(cfg, self.projection, self.attend, self.mesh, name=param_paths.block(i)) for i in range(cfg.L)]
    self.final_norm = Norm(
      cfg.norm_kind,
      cfg.final_norm,
      cfg.eps,
      cfg.compute_dtype,
      cfg.param_dtype,
      cfg.alpha_init(2),
      cfg.derf_shift,
      cfg.final_norm_gain_init or cfg.norm_gain_init,
      cfg.repbn_gain_init,
    )
    if cfg.pointwise:  # DyT's and Derf's language models scale the embeddings by a learned scalar, initially √D
      self.embed_scale = self.param(
        param_paths.EMBED_SCALE,
        nn.with_logical_partitioning(nn.initializers.constant(cfg.D**0.5), ()),
        (),
        cfg.param_dtype,
      )
    self.pre_logit = ScaleMonitor(cfg.norm_kind, cfg.eps)
    if not cfg.tie_embeddings:
      self.head = self.param(
        param_paths.HEAD,
        nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), ("embed", "vocab")),
        (cfg.D, cfg.V),
        cfg.param_dtype,
      )
    if cfg.logits_bias:
      zeros = nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",))
      self.logits_bias = self.param(param_paths.LOGITS_BIAS, zeros, (cfg.V,), cfg.param_dtype)

  def __call__(
    self,
    tokens_BxT: Array,
    gate: Gates | Array | float = 1.0,
    *,
    positions_BxT: Array | None = None,
    return_hidden: bool = False,
  ) -> Array | tuple[Array, Array]:
    """Logits B×T×V (fp32); with `return_hidden` also the pre-logit residual stream h (B×T×D)."""
    h_BxTxD = self.hidden(tokens_BxT, gate, positions_BxT=positions_BxT)
    logits_BxTxV = self.logits(h_BxTxD, gate)
    return (logits_BxTxV, h_BxTxD) if return_hidden else logits_BxTxV

  def hidden(
    self, tokens_BxT: Array, gate: Gates | Array | float = 1.0, *, positions_BxT: Array | None = None
  ) -> Array:
    """The pre-logit residual stream h (the input of the final norm)."""
    if positions_BxT is None:
      if self.cfg.family == "gpt2" and tokens_BxT.shape[1] > self.cfg.T:
        raise ValueError(
          f"tokens_BxT has length {tokens_BxT.shape[1]} > model.T={self.cfg.T}, the number of learned "
          "positions of a gpt2 model; cut the input or use a model with a larger T"
        )
      positions_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)
    gates = as_gates(gate, self.cfg.L)
    h_BxTxD = self.embed_tokens(tokens_BxT, positions_BxT)
    if self.cfg.scanned and not self.is_initializing():  # init makes the per-layer tree block by block
      h_BxTxD = self.scanned_blocks(h_BxTxD, positions_BxT, gates)
    else:
      for i in range(self.cfg.L):
        h_BxTxD = self.block(i, h_BxTxD, positions_BxT, gates)
    self.pre_logit(h_BxTxD)
    return h_BxTxD

  def scanned_blocks(self, h_BxTxD: Array, positions_BxT: Array, gates: Gates) -> Array:
    """The L blocks as one block under a scan over their stacked variables (`model.scan_layers`, layer_scan.py);
    each block's batch statistics are written where the unrolled block writes them."""
    cfg, mesh = self.cfg, self.mesh
    block = Block(cfg, self.projection, self.attend, mesh, parent=None)  # applied functionally, one layer per trip
    layers = layer_scan.stack(self.variables, cfg.L)
    layers = layer_scan.keep_sharding(layers, block, (h_BxTxD, positions_BxT, gates.block(0)), mesh)
    shard = lambda h_BxTxD: sharding.constrain(h_BxTxD, sharding.HIDDEN_AXES, mesh)
    record = self.is_mutable_collection(CALIB_STATS)
    h_BxTxD, stats = layer_scan.scan(
      block, layers, h_BxTxD, positions_BxT, gates, record=record, remat=cfg.remat, shard=shard
    )
    for i, block_stats in enumerate(layer_scan.unstack(stats, cfg.L)):
      if jax.tree.leaves(block_stats):  # merged into the block's subtree, as its norms' own writes would be
        self.put_variable(CALIB_STATS, param_paths.block(i), block_stats)
    return h_BxTxD

  def last_hidden(self, tokens_BxT: Array, gate: Gates | Array | float = 1.0) -> Array:
    """The pre-logit state of the last position only (B×1×D): the last block's queries and MLP run there alone."""
    positions_BxT = jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape)
    gates = as_gates(gate, self.cfg.L)
    h_BxTxD = self.embed_tokens(tokens_BxT, positions_BxT)
    for i in range(self.cfg.L - 1):
      h_BxTxD = self.block(i, h_BxTxD, positions_BxT, gates)
    return self.block(self.cfg.L - 1, h_BxTxD, positions_BxT, gates, last_only=True)

  def decode(
    self,
    tokens_BxQ: Array,
    cache: list[LayerCache],
    index_B: Array,
    gate: Gates | Array | float = 1.0,
    from_start: bool = False,
  ) -> tuple[Array, list[LayerCache]]:
    """Runs Q new tokens per row at positions index_B + 0…Q−1 over the KV cache; returns (h_BxQxD, cache).

    `from_start=True` promises index_B = 0 everywhere (a prefill): the chunk then attends within itself through
    `model.attention_impl`, which sees exactly the slots the cache would show it.
    """
    if len(cache) != self.cfg.L:
      raise ValueError(f"the cache has {len(cache)} layers, the model {self.cfg.L}")
    check_cache_write(self.cfg, tokens_BxQ.shape[1], cache[0]["k"].shape[-1], index_B)
    positions_BxQ = index_B[:, None] + jnp.arange(tokens_BxQ.shape[1])[None, :]
    gates = as_gates(gate, self.cfg.L)
    h_BxQxD = self.embed_tokens(tokens_BxQ, positions_BxQ)
    new_cache = []
    for i, layer_cache in enumerate(cache):
      h_BxQxD, layer_cache = self.block(i, h_BxQxD, positions_BxQ, gates, layer_cache, index_B, from_start)
      new_cache.append(layer_cache)
    return h_BxQxD, new_cache

  def block(
    self,
    i: int,
    h_BxTxD: Array,
    positions_BxT: Array,
    gates: Gates,
    cache: LayerCache | None = None,
    index_B: Array | None = None,
    from_start: bool = False,
    last_only: bool = False,
  ) -> Any:
    """Block i with its gates; every argument goes by position, as `nn.remat`'s static arguments must."""
    out = self.blocks[i](h_BxTxD, positions_BxT, gates.block(i), cache, index_B, from_start, last_only)
    return self.shard(out) if cache is None else (self.shard(out[0]), out[1])

  def shard(self, h_BxTxD: Array) -> Array:
    """h with its batch split over every device of `mesh` (unchanged without one)."""
    return sharding.constrain(h_BxTxD, sharding.HIDDEN_AXES, self.mesh)

  def embed_tokens(self, tokens_BxT: Array, positions_BxT: Array) -> Array:
    """Token embeddings (plus learned positions for gpt2) in the compute dtype."""
    cfg = self.cfg
    h_BxTxD = jnp.take(self.embed, tokens_BxT, axis=0).astype(cfg.compute_dtype)
    if cfg.family == "gpt2":
      h_BxTxD += jnp.take(self.pos_embed, positions_BxT, axis=0).astype(cfg.compute_dtype)
    if cfg.pointwise:
      h_BxTxD *= self.embed_scale.astype(cfg.compute_dtype)
    return self.shard(h_BxTxD)

  def logits(self, h_BxTxD: Array, gate: Gates | Array | float = 1.0) -> Array:
    """Final norm and output head applied to the pre-logit state h; fp32 logits (fp64 for fp64 models)."""
    cfg, dt = self.cfg, self.cfg.compute_dtype
    out_dt = jnp.promote_types(dt, jnp.float32)
    x_BxTxD = self.final_norm(h_BxTxD, as_gates(gate, cfg.L).final).astype(dt)
    if cfg.tie_embeddings:  # contract the table's own D axis: no transposed copy of V×D per call
      logits_BxTxV = self.projection(self, param_paths.EMBED, "bld,vd->blv", x_BxTxD, self.embed.astype(dt))
    else:
      logits_BxTxV = self.projection(self, param_paths.HEAD, "bld,dv->blv", x_BxTxD, self.head.astype(dt))
    logits_BxTxV = logits_BxTxV.astype(out_dt)
    if cfg.logits_bias:
      logits_BxTxV += self.logits_bias.astype(out_dt)
    return sharding.constrain(logits_BxTxV, sharding.LOGITS_AXES, self.mesh)
