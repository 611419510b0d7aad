"""Hugging Face Llama checkpoints out: a llama-family model with plain RMSNorms as a `LlamaForCausalLM` directory.

    save_llama(variables, model_cfg, DIR)    DIR: config.json + model.safetensors (numpy only: no PyTorch)

Every tensor goes through `TABLE`: a Hugging Face name (`{i}` the block index), its path in the
model (names from `param_paths.py`) and the fix from the model's layout to Hugging Face's. `nn.Linear`
stores weights as (out, in), so every projection is transposed: q, k and v are the three slices
of `qkv` (D, 3, H, K), each (D, H·K) with heads major, then (H·K, D); `o_proj` reads merged heads,
(H, K, D) → (D, H·K). No head permutation: `model/layers.py`'s `rope` is the rotate-half form that Hugging
Face's `apply_rotary_pos_emb` computes (the first K/2 features of a head pair with the last K/2),
so the model's head layout is already Hugging Face's. experiments/benchmark_peer.py checks the
logits against transformers; tests/hf/test_llama.py against a numpy Llama read from the file.
"""

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import safetensors.numpy
from etils import epath
from flax import traverse_util

from tapernorm_jax.storage import run_files
from tapernorm_jax.hf.hub import CONFIG_FILE, WEIGHTS_FILE
from tapernorm_jax.model import ModelConfig, check_matches, param_paths
from tapernorm_jax.model.param_paths import Path as ModelPath

PyTree = Any
BLOCK = "{i}"  # stands for the block index in TABLE
Fix = Callable[[np.ndarray, ModelConfig], np.ndarray]


def same(x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """No change: the two layouts agree."""
  return x


def transposed(w_InxOut: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """(in, out) → nn.Linear's (out, in)."""
  return w_InxOut.T


def qkv_slice(i: int) -> Fix:
  """The fix that takes q (0), k (1) or v (2) out of qkv (D, 3, H, K) as nn.Linear's (H·K, D)."""
  return lambda w_Dx3xHxK, cfg: w_Dx3xHxK[:, i].reshape(cfg.D, cfg.D).T


def merged_heads(w_HxKxD: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """out (H, K, D) → o_proj's (D, H·K)."""
  return w_HxKxD.reshape(cfg.D, cfg.D).T


@dataclasses.dataclass(frozen=True)
class Rule:
  """One Hugging Face tensor: its name, the model path it comes from and the fix between the layouts."""

  hf: str
  path: ModelPath
  to_hf: Fix = same


_LAYER, _ATTN, _MLP = "model.layers.{i}", (BLOCK, param_paths.ATTN), (BLOCK, param_paths.MLP)
TABLE: tuple[Rule, ...] = (
  Rule("model.embed_tokens.weight", (param_paths.EMBED,)),
  Rule(f"{_LAYER}.input_layernorm.weight", (BLOCK, param_paths.ATTN_NORM, param_paths.GAMMA)),
  *(
    Rule(f"{_LAYER}.self_attn.{name}_proj.weight", _ATTN + (param_paths.QKV,), qkv_slice(i))
    for i, name in enumerate("qkv")
  ),
  Rule(f"{_LAYER}.self_attn.o_proj.weight", _ATTN + (param_paths.ATTN_OUT,), merged_heads),
  Rule(f"{_LAYER}.post_attention_layernorm.weight", (BLOCK, param_paths.MLP_NORM, param_paths.GAMMA)),
  Rule(f"{_LAYER}.mlp.gate_proj.weight", _MLP + (param_paths.WI_GATE,), transposed),
  Rule(f"{_LAYER}.mlp.up_proj.weight", _MLP + (param_paths.WI_UP,), transposed),
  Rule(f"{_LAYER}.mlp.down_proj.weight", _MLP + (param_paths.WO,), transposed),
  Rule("model.norm.weight", (param_paths.FINAL_NORM, param_paths.GAMMA)),
)
HEAD = Rule("lm_head.weight", (param_paths.HEAD,), transposed)  # untied models only


def rules(cfg: ModelConfig) -> list[tuple[str, ModelPath, Fix]]:
  """TABLE expanded over the blocks of `cfg` as (Hugging Face name, model path, fix), in file order."""
  out = []
  for rule in TABLE + ((HEAD,) if not cfg.tie_embeddings else ()):
    for i in range(cfg.L) if BLOCK in rule.path else (None,):
      path = tuple(param_paths.block(i) if p == BLOCK else p for p in rule.path)
      out.append((rule.hf.format(i=i), path, rule.to_hf))
  return out


def exportable(cfg: ModelConfig) -> None:
  """Raises ValueError saying why a model cannot be written as a Hugging Face Llama, if it cannot."""
  if cfg.family != "llama":
    raise ValueError(f"model.family={cfg.family!r}: only llama-family models are Hugging Face Llama models")
  for field in ("internal_norm", "final_norm"):
    mode = getattr(cfg, field)
    if mode != "plain":
      raise ValueError(
        f"model.{field}={mode!r}: Hugging Face Llama has a plain RMSNorm at every norm site; write "
        "the `baseline` form of a tapered model (inference.forms), whose norms are plain"
      )
  if cfg.logits_bias:
    raise ValueError("model.logits_bias=True: Hugging Face Llama's lm_head has no bias")


def hf_config(cfg: ModelConfig, bos_id: int | None = None, eos_id: int | None = None) -> dict:
  """A LlamaConfig transformers can read, reproducing `cfg` (multi-head attention, no biases, no dropout)."""
  return {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": cfg.V,
    "hidden_size": cfg.D,
    "intermediate_size": cfg.mlp_dim,
    "num_hidden_layers": cfg.L,
    "num_attention_heads": cfg.H,
    "num_key_value_heads": cfg.H,
    "head_dim": cfg.K,
    "hidden_act": "silu",
    "max_position_embeddings": cfg.T,
    "rms_norm_eps": cfg.eps,
    "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
    "tie_word_embeddings": cfg.tie_embeddings,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": cfg.init_std,
    "use_cache": True,
    "dtype": "float32",
    "bos_token_id": bos_id,
    "eos_token_id": eos_id,
    "pad_token_id": None,
  }


def llama_tensors(variables: PyTree, cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Every tensor of the checkpoint, float32 numpy arrays under their Hugging Face names."""
  params = traverse_util.flatten_dict(nn.unbox(variables)["params"])
  return {
    name: np.ascontiguousarray(fix(np.asarray(jax.device_get(params[path])), cfg).astype(np.float32))
    for name, path, fix in rules(cfg)
  }


def save_llama(
  variables: PyTree, model_cfg: Any, directory: str | os.PathLike, bos_id: int | None = None, eos_id: int | None = None
) -> epath.Path:
  """Writes a llama model with plain norms as a Hugging Face Llama directory (config.json, model.safetensors),
  local or a URL; returns it."""
  cfg = ModelConfig.from_config(model_cfg)
  exportable(cfg)
  check_matches(nn.unbox(variables), cfg)
  tensors = llama_tensors(variables, cfg)
  directory = run_files.workdir_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  with run_files.atomic_path(directory / WEIGHTS_FILE) as tmp:
    safetensors.numpy.save_file(tensors, tmp, metadata={"format": "pt"})  # transformers wants format=pt
    os.chmod(tmp, 0o644)  # safetensors creates it owner-only
  run_files.write_json_atomically(directory / CONFIG_FILE, hf_config(cfg, bos_id, eos_id))
  return directory
