"""The block's two sublayers, `Attention` (causal multi-head, RoPE for llama, optionally over a KV cache) and `Mlp`
(SwiGLU for llama, GELU for gpt2), and the parameter helpers they share. Shape letters as in transformer.py."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from tapernorm_jax.model import attention, param_paths
from tapernorm_jax.model.config import ModelConfig
from tapernorm_jax.model.kv_cache import LayerCache, cached_attention, write_cache
from tapernorm_jax.model.seams import Attend, Projection, einsum

Array = jax.Array


def param(
  module: nn.Module, name: str, shape: tuple[int, ...], axes: tuple[str | None, ...], std: float | None, dtype: Any
) -> Array:
  """A parameter with logical axis names; normal(std) init, or zeros when std is None."""
  init = nn.initializers.zeros if std is None else nn.initializers.normal(std)
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


def residual_out(
  module: nn.Module, x: Array, name: str, bias_name: str, in_shape: tuple[int, ...], in_axes: tuple[str, ...], spec: str
) -> Array:
  """A projection back into the residual stream (`spec` contracts x's trailing `in_shape` axes with the weight's),
  its init scaled by 1/√(2L) (GPT-2's residual scaling), with a bias for gpt2."""
  cfg, dt = module.cfg, module.cfg.compute_dtype
  w = param(module, name, in_shape + (cfg.D,), in_axes + ("embed",), cfg.init_std / (2 * cfg.L) ** 0.5, cfg.param_dtype)
  y_BxTxD = module.projection(module, name, spec, x, w.astype(dt))
  if cfg.family == "gpt2":
    y_BxTxD += param(module, bias_name, (cfg.D,), ("embed",), None, cfg.param_dtype).astype(dt)
  return y_BxTxD


def rope(x_BxTxHxK: Array, positions_BxT: Array, base: float) -> Array:
  """Rotary position embedding (rotate-half form), computed in fp32 (fp64 for fp64 inputs)."""
  K, ct = x_BxTxHxK.shape[-1], jnp.promote_types(x_BxTxHxK.dtype, jnp.float32)
  freq_K2 = base ** (-jnp.arange(0, K, 2, dtype=ct) / K)
  angle_BxTx1xK2 = positions_BxT[..., None, None].astype(ct) * freq_K2
  sin, cos = jnp.sin(angle_BxTx1xK2), jnp.cos(angle_BxTx1xK2)
  x1, x2 = jnp.split(x_BxTxHxK.astype(ct), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_BxTxHxK.dtype)


class Attention(nn.Module):
  """Causal multi-head self-attention through `model.attention_impl` (attention.py) or `attend`, optionally over a
  KV cache."""

  cfg: ModelConfig
  projection: Projection = einsum
  attend: Attend | None = None
  mesh: Mesh | None = None

  @nn.compact
  def __call__(
    self,
    x_BxTxD: Array,
    positions_BxT: Array,
    cache: LayerCache | None = None,
    index_B: Array | None = None,
    *,
    from_start: bool = False,
    last_only: bool = False,
    x_v_BxTxD: Array | None = None,
  ) -> Array | tuple[Array, LayerCache]:
    """Attends causally; with `cache`, writes this chunk's K/V at `index_B` and returns (B×T×D, cache).

    `from_start`: the chunk starts every row at slot 0 (a prefill), so it attends within itself through the
    selected implementation instead of over the cache. `last_only`: only the last position's output (B×1×D).
    `x_v_BxTxD`: the values' own input (queries and keys from x), as the same projection's last third.
    """
    cfg = self.cfg
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK = self.queries_keys_values(x_BxTxD, x_v_BxTxD, last_only)
    if cfg.family == "llama":
      q_BxTxHxK = rope(q_BxTxHxK, positions_BxT[:, -1:] if last_only else positions_BxT, cfg.rope_base)
      k_BxTxHxK = rope(k_BxTxHxK, positions_BxT, cfg.rope_base)
    if cache is not None:
      cache = {
        "k": write_cache(cache["k"], k_BxTxHxK, index_B, keys=True, mesh=self.mesh),
        "v": write_cache(cache["v"], v_BxTxHxK, index_B, keys=False, mesh=self.mesh),
      }
    if last_only:  # the last position sees every key: no mask
      out_BxTxHxK = jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, implementation="xla")
    elif cache is None or from_start:
      out_BxTxHxK = (
        self.attend(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)
        if self.attend
        else attention.causal_attention(
          q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, cfg.attention_impl, cfg.target_platform, self.mesh
        )
      )
    else:
      out_BxTxHxK = cached_attention(q_BxTxHxK, cache["k"], cache["v"], positions_BxT)
    out_BxTxD = self.project_out(out_BxTxHxK)
    return out_BxTxD if cache is None else (out_BxTxD, cache)

  def queries_keys_values(self, x_BxTxD: Array, x_v_BxTxD: Array | None, last_only: bool) -> tuple[Array, Array, Array]:
    """q, k and v (each B×T×H×K) from the one fused projection, computing only what is used: the values from
    `x_v_BxTxD` where given (the same weights' last third), the query of the last position only with `last_only`."""
    cfg, dt = self.cfg, self.cfg.compute_dtype
    K = cfg.K
    w_qkv_Dx3xHxK = param(
      self, param_paths.QKV, (cfg.D, 3, cfg.H, K), ("embed", None, "heads", "kv"), cfg.init_std, cfg.param_dtype
    ).astype(dt)
    bias_3xHxK = (
      param(self, param_paths.QKV_BIAS, (3, cfg.H, K), (None, "heads", "kv"), None, cfg.param_dtype).astype(dt)
      if cfg.input_biases
      else None
    )

    def heads(x_BxTxD: Array, first: int, last: int) -> Array:
      """Parts first..last−1 of (q, k, v) at every position of x, each B×T×H×K."""
      which = slice(first, last)
      # Output axes follow the kernel's (b, l, then 3, h, k): a `tblhk` output makes XLA transpose the kernel.
      out_BxTxnxHxK = self.projection(
        self, param_paths.QKV, "bld,dthk->blthk", x_BxTxD.astype(dt), w_qkv_Dx3xHxK[:, which], which
      )
      if bias_3xHxK is not None:
        out_BxTxnxHxK = out_BxTxnxHxK + bias_3xHxK[which]
      # split, not slices: its gradient is one concatenation, theirs padded copies summed
      return [part[:, :, 0] for part in jnp.split(out_BxTxnxHxK, last - first, axis=2)]

    x_q_BxTxD = x_BxTxD[:, -1:] if last_only else x_BxTxD
    if x_v_BxTxD is not None:  # two inputs: the same weights, split (no more FLOPs than one fused projection)
      (v_BxTxHxK,) = heads(x_v_BxTxD, 2, 3)
      if last_only:
        return (*heads(x_q_BxTxD, 0, 1), *heads(x_BxTxD, 1, 2), v_BxTxHxK)
      return (*heads(x_BxTxD, 0, 2), v_BxTxHxK)
    if last_only:  # keys and values of every position, the query of the last one only
      return (*heads(x_q_BxTxD, 0, 1), *heads(x_BxTxD, 1, 3))
    return tuple(heads(x_BxTxD, 0, 3))

  def project_out(self, out_BxTxHxK: Array) -> Array:
    """The output projection H×K → D (with bias for gpt2)."""
    cfg = self.cfg
    return residual_out(
      self,
      out_BxTxHxK,
      param_paths.ATTN_OUT,
      param_paths.ATTN_OUT_BIAS,
      (cfg.H, cfg.K),
      ("heads", "kv"),
      "bthk,hkd->btd",
    )


class Mlp(nn.Module):
  """SwiGLU (`wi_0` gate, `wi_1` up; biased with model.input_bias) for llama, GELU-tanh with biases for gpt2."""

  cfg: ModelConfig
  projection: Projection = einsum

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    """Position-wise feed-forward, B×T×D → B×T×D."""
    cfg, dt = self.cfg, self.cfg.compute_dtype
    F, x_BxTxD = cfg.mlp_dim, x_BxTxD.astype(dt)
    dense_in = lambda name: self.projection(
      self,
      name,
      "btd,df->btf",
      x_BxTxD,
      param(self, name, (cfg.D, F), ("embed", "mlp"), cfg.init_std, cfg.param_dtype).astype(dt),
    )
    bias = lambda name: param(self, name, (F,), ("mlp",), None, cfg.param_dtype).astype(dt)
    if cfg.family == "llama":
      gate_BxTxF, up_BxTxF = dense_in(param_paths.WI_GATE), dense_in(param_paths.WI_UP)
      if cfg.input_bias:
        gate_BxTxF, up_BxTxF = gate_BxTxF + bias(param_paths.WI_GATE_BIAS), up_BxTxF + bias(param_paths.WI_UP_BIAS)
      hidden_BxTxF = nn.silu(gate_BxTxF) * up_BxTxF
    else:
      bias_F = bias(param_paths.WI_BIAS)
      hidden_BxTxF = nn.gelu(dense_in(param_paths.WI) + bias_F, approximate=True)
    return residual_out(self, hidden_BxTxF, param_paths.WO, param_paths.WO_BIAS, (F,), ("mlp",), "btf,fd->btd")
