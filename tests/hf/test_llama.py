"""Hugging Face Llama export, checked without PyTorch: a numpy Llama reads the written file and must give the model's
logits (experiments/benchmark_peer.py checks the same file against transformers itself)."""

import json

import jax
import numpy as np
import pytest
import safetensors.numpy

from tapernorm_jax.hf import llama
from tapernorm_jax.hf.hub import CONFIG_FILE, WEIGHTS_FILE
from tapernorm_jax.inference import forms
from tapernorm_jax.model import ModelConfig, Transformer, init

TAPERED = ModelConfig(family="llama", V=61, D=32, H=4, L=2, T=32, internal_norm="taper", final_norm="plain")


def unoptimized(fn, *args):
  """fn(*args) jitted without XLA optimisation: this file's small programs compile in a fraction of the time."""
  return jax.jit(fn).lower(*args).compile(compiler_options={"xla_backend_optimization_level": 0})(*args)


def rms_norm(x_TxD: np.ndarray, weight_D: np.ndarray, eps: float) -> np.ndarray:
  """LlamaRMSNorm: x · rsqrt(mean(x²) + ε) · weight."""
  return x_TxD / np.sqrt(np.mean(x_TxD**2, axis=-1, keepdims=True) + eps) * weight_D


def rotate_half(x: np.ndarray) -> np.ndarray:
  """Hugging Face's rotate_half: (x1, x2) → (−x2, x1) over the last axis."""
  x1, x2 = np.split(x, 2, axis=-1)
  return np.concatenate([-x2, x1], axis=-1)


def hf_llama_logits(tensors: dict[str, np.ndarray], config: dict, tokens_T: np.ndarray) -> np.ndarray:
  """LlamaForCausalLM's forward for one sequence, in float64 numpy, from Hugging Face names and config fields."""
  w = {name: x.astype(np.float64) for name, x in tensors.items()}
  H, K, eps = config["num_attention_heads"], config["head_dim"], config["rms_norm_eps"]
  T = len(tokens_T)
  inv_freq_K2 = 1.0 / config["rope_parameters"]["rope_theta"] ** (np.arange(0, K, 2) / K)
  angle_TxK = np.concatenate([np.outer(np.arange(T), inv_freq_K2)] * 2, axis=-1)
  cos_Tx1xK, sin_Tx1xK = np.cos(angle_TxK)[:, None], np.sin(angle_TxK)[:, None]
  causal_TxT = np.tril(np.ones((T, T), bool))
  h_TxD = w["model.embed_tokens.weight"][tokens_T]
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    x_TxD = rms_norm(h_TxD, w[p + "input_layernorm.weight"], eps)
    q_TxHxK, k_TxHxK, v_TxHxK = ((x_TxD @ w[p + f"self_attn.{n}_proj.weight"].T).reshape(T, H, K) for n in "qkv")
    q_TxHxK = q_TxHxK * cos_Tx1xK + rotate_half(q_TxHxK) * sin_Tx1xK
    k_TxHxK = k_TxHxK * cos_Tx1xK + rotate_half(k_TxHxK) * sin_Tx1xK
    scores_HxTxT = np.einsum("thk,shk->hts", q_TxHxK, k_TxHxK) / np.sqrt(K)
    scores_HxTxT = np.where(causal_TxT, scores_HxTxT, -np.inf)
    probs_HxTxT = np.exp(scores_HxTxT - scores_HxTxT.max(-1, keepdims=True))
    probs_HxTxT /= probs_HxTxT.sum(-1, keepdims=True)
    attn_TxD = np.einsum("hts,shk->thk", probs_HxTxT, v_TxHxK).reshape(T, H * K)
    h_TxD = h_TxD + attn_TxD @ w[p + "self_attn.o_proj.weight"].T
    x_TxD = rms_norm(h_TxD, w[p + "post_attention_layernorm.weight"], eps)
    gate_TxF, up_TxF = (x_TxD @ w[p + f"mlp.{n}_proj.weight"].T for n in ("gate", "up"))
    h_TxD = h_TxD + (gate_TxF / (1 + np.exp(-gate_TxF)) * up_TxF) @ w[p + "mlp.down_proj.weight"].T
  head_VxD = w["model.embed_tokens.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
  return rms_norm(h_TxD, w["model.norm.weight"], eps) @ head_VxD.T


@pytest.fixture(scope="module")
def baseline() -> tuple[dict, ModelConfig]:
  """The baseline form (plain RMSNorms) of calibrated-looking internal_taper weights."""
  make = lambda key: forms.perturbed(init(TAPERED, key), jax.random.fold_in(key, 1), c_range=(0.5, 2.0), spread=0.2)
  variables = unoptimized(make, jax.random.key(0))
  return forms.forms(variables, TAPERED)["baseline"]


@pytest.mark.parametrize("tie", [True, False])
def test_numpy_llama_from_the_file_gives_the_model_logits(tmp_path, baseline, tie):
  variables, cfg = baseline
  if not tie:  # an untied head: lm_head.weight is written, from a head unlike the embedding
    cfg = cfg.replace(tie_embeddings=False)
    head = np.asarray(variables["params"]["embed"]).T[:, ::-1] * 0.5
    variables = {**variables, "params": {**variables["params"], "head": np.ascontiguousarray(head)}}
  llama.save_llama(variables, cfg, tmp_path, eos_id=3)
  config = json.loads((tmp_path / CONFIG_FILE).read_text())
  tensors = safetensors.numpy.load_file(str(tmp_path / WEIGHTS_FILE))
  assert ("lm_head.weight" in tensors) == (not tie)
  assert len(tensors) == 2 + 9 * cfg.L + (not tie)
  assert (
    config["model_type"],
    config["hidden_size"],
    config["intermediate_size"],
    config["num_key_value_heads"],
    config["max_position_embeddings"],
    config["eos_token_id"],
  ) == ("llama", cfg.D, cfg.mlp_dim, cfg.H, cfg.T, 3)
  assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (cfg.D, cfg.D)
  assert tensors["model.layers.1.mlp.gate_proj.weight"].shape == (cfg.mlp_dim, cfg.D)
  tokens_T = np.random.default_rng(0).integers(0, cfg.V, cfg.T)
  expected_TxV = hf_llama_logits(tensors, config, tokens_T)
  logits_TxV = np.asarray(unoptimized(Transformer(cfg).apply, variables, tokens_T[None]))[0]
  assert np.abs(logits_TxV - expected_TxV).max() <= 1e-5 * np.abs(expected_TxV).max()


@pytest.mark.parametrize(
  "form, message",
  [("fixed", "internal_norm='fixed'"), ("folded", "internal_norm='identity'"), ("gpt2", "family='gpt2'")],
)
def test_save_refuses_what_llama_cannot_express(tmp_path, baseline, form, message):
  variables, cfg = baseline
  cfg = {
    "fixed": TAPERED.fixed_form(),
    "folded": cfg.replace(internal_norm="identity"),
    "gpt2": cfg.replace(family="gpt2"),
  }[form]
  with pytest.raises(ValueError, match=message):
    llama.save_llama(variables, cfg, tmp_path)
  assert not (tmp_path / WEIGHTS_FILE).exists()
