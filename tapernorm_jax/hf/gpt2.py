"""Hugging Face GPT-2 checkpoints in and out: one name table plus small fix functions (MaxText's way).

    load_gpt2("gpt2" | "owner/name" | DIR) -> (variables, model_cfg)   DIR: config.json + model.safetensors
    save_gpt2(variables, model_cfg, DIR)                              the reverse, for LayerNorm models

Every tensor goes through `TABLE`: a Hugging Face name (`{i}` the block index, with or without the
`transformer.` prefix of `save_pretrained` files), its path in the model (names from
`param_paths.py`), its Hugging Face shape in config letters and the fix between the two layouts.
GPT-2's Conv1D stores weights as (in, out), so every fix is a reshape: `c_attn` (D, 3D) splits
into q, k, v and then heads, (D, 3, H, K); `attn.c_proj` (D, D) reads merged heads, (H, K, D).
Loading reads safetensors as numpy arrays (no PyTorch, no transformers) and fails, naming the
tensor or field, on anything it would otherwise have to guess: a missing, misshapen or
unexpected tensor, a config field GPT-2 in this model cannot reproduce, a corrupted file.
"""

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from etils import epath
from flax import traverse_util

from tapernorm_jax.storage import run_files
from tapernorm_jax.hf.hub import CONFIG_FILE, MODEL_FILES, WEIGHTS_FILE, read_config, resolve
from tapernorm_jax.model import ModelConfig, check_matches, init, param_paths
from tapernorm_jax.model.param_paths import Path as ModelPath

PyTree = Any
PREFIX = "transformer."  # `save_pretrained` of GPT2LMHeadModel prefixes the body's names; hub files don't
IGNORED = re.compile(r"(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)")  # causal-mask buffers; the tied head
ACTIVATION = "gelu_new"  # GELU with the tanh approximation, the model's gpt2 MLP
BLOCK = "{i}"  # stands for the block index in TABLE
Fix = Callable[[np.ndarray, ModelConfig], np.ndarray]


def same(x: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """No change: the two layouts agree."""
  return x


def split_qkv(w_Dx3D: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """c_attn (…, 3D), columns q | k | v, each heads-major, → (…, 3, H, K); for the weight and the bias."""
  return w_Dx3D.reshape(w_Dx3D.shape[:-1] + (3, cfg.H, cfg.K))


def merge_qkv(w_Dx3xHxK: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """(…, 3, H, K) → c_attn's (…, 3D)."""
  return w_Dx3xHxK.reshape(w_Dx3xHxK.shape[:-3] + (3 * cfg.D,))


def split_heads(w_DxD: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """attn.c_proj (D, D), rows the merged heads, → (H, K, D)."""
  return w_DxD.reshape(cfg.H, cfg.K, cfg.D)


def merge_heads(w_HxKxD: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """(H, K, D) → attn.c_proj's (D, D)."""
  return w_HxKxD.reshape(cfg.D, cfg.D)


@dataclasses.dataclass(frozen=True)
class Rule:
  """One Hugging Face tensor: its name, its model path, its shape in config letters, and the fixes both ways."""

  hf: str
  path: ModelPath
  dims: tuple[str, ...]
  to_model: Fix = same
  to_hf: Fix = same


def _norm_rules(hf: str, path: ModelPath) -> tuple[Rule, ...]:
  """A LayerNorm's weight → γ and bias → β."""
  return (
    Rule(f"{hf}.weight", path + (param_paths.GAMMA,), ("D",)),
    Rule(f"{hf}.bias", path + (param_paths.BETA,), ("D",)),
  )


_ATTN, _MLP = (BLOCK, param_paths.ATTN), (BLOCK, param_paths.MLP)
TABLE: tuple[Rule, ...] = (
  Rule("wte.weight", (param_paths.EMBED,), ("V", "D")),
  Rule("wpe.weight", (param_paths.POS_EMBED,), ("T", "D")),
  *_norm_rules("h.{i}.ln_1", (BLOCK, param_paths.ATTN_NORM)),
  Rule("h.{i}.attn.c_attn.weight", _ATTN + (param_paths.QKV,), ("D", "3D"), split_qkv, merge_qkv),
  Rule("h.{i}.attn.c_attn.bias", _ATTN + (param_paths.QKV_BIAS,), ("3D",), split_qkv, merge_qkv),
  Rule("h.{i}.attn.c_proj.weight", _ATTN + (param_paths.ATTN_OUT,), ("D", "D"), split_heads, merge_heads),
  Rule("h.{i}.attn.c_proj.bias", _ATTN + (param_paths.ATTN_OUT_BIAS,), ("D",)),
  *_norm_rules("h.{i}.ln_2", (BLOCK, param_paths.MLP_NORM)),
  Rule("h.{i}.mlp.c_fc.weight", _MLP + (param_paths.WI,), ("D", "F")),
  Rule("h.{i}.mlp.c_fc.bias", _MLP + (param_paths.WI_BIAS,), ("F",)),
  Rule("h.{i}.mlp.c_proj.weight", _MLP + (param_paths.WO,), ("F", "D")),
  Rule("h.{i}.mlp.c_proj.bias", _MLP + (param_paths.WO_BIAS,), ("D",)),
  *_norm_rules("ln_f", (param_paths.FINAL_NORM,)),
)


@dataclasses.dataclass(frozen=True)
class Entry:
  """A rule instantiated for one block (or the whole model): concrete name, path and HF shape."""

  rule: Rule
  hf: str
  path: ModelPath
  shape: tuple[int, ...]


def entries(cfg: ModelConfig) -> list[Entry]:
  """TABLE expanded over the blocks of `cfg`: every tensor of a GPT-2 checkpoint, in file order."""
  out = []
  for rule in TABLE:
    shape = tuple(_dim(cfg, d) for d in rule.dims)
    if BLOCK in rule.path:
      for i in range(cfg.L):
        path = tuple(param_paths.block(i) if p == BLOCK else p for p in rule.path)
        out.append(Entry(rule, rule.hf.format(i=i), path, shape))
    else:
      out.append(Entry(rule, rule.hf, rule.path, shape))
  return out


def _dim(cfg: ModelConfig, letter: str) -> int:
  """The size of a config letter: V, T, D, 3D or F."""
  return {"V": cfg.V, "T": cfg.T, "D": cfg.D, "3D": 3 * cfg.D, "F": cfg.mlp_dim}[letter]


def _shape_source(config: dict, dims: tuple[str, ...]) -> str:
  """The config.json fields a shape comes from, with their values, e.g. `n_embd=768`."""
  default_f = "F" in dims and not config.get("n_inner")
  fields = {
    "V": "vocab_size",
    "T": "n_positions",
    "D": "n_embd",
    "3D": "n_embd",
    "F": "n_embd" if default_f else "n_inner",
  }
  source = ", ".join(f"{f}={config[f]}" for f in dict.fromkeys(fields[d] for d in dims))
  return source + (" (n_inner unset: 4·n_embd)" if default_f else "")


def model_config(config: dict, path: Path) -> ModelConfig:
  """The gpt2-family ModelConfig that reproduces a Hugging Face GPT-2 config.json; refuses what it cannot."""

  def refuse(field: str, problem: str) -> None:
    raise ValueError(f"{path}: {field}={json.dumps(config.get(field))}: {problem}")

  if config.get("model_type", "gpt2") != "gpt2":
    refuse("model_type", "not a GPT-2 checkpoint (model_type must be 'gpt2')")
  for field in ("n_embd", "n_head", "n_layer", "n_positions", "vocab_size"):
    if not isinstance(config.get(field), int):
      refuse(field, "missing or not an integer; a GPT-2 config.json sets it")
  if config.get("activation_function", ACTIVATION) != ACTIVATION:
    refuse("activation_function", f"this model's gpt2 MLP is GELU with the tanh approximation, {ACTIVATION!r}")
  if not config.get("scale_attn_weights", True):
    refuse("scale_attn_weights", "the model always scales attention scores by 1/sqrt(K)")
  if config.get("scale_attn_by_inverse_layer_idx", False):
    refuse("scale_attn_by_inverse_layer_idx", "the model has no per-layer attention scaling")
  if config.get("add_cross_attention", False):
    refuse("add_cross_attention", "the model is decoder-only (no cross-attention)")
  if not config.get("tie_word_embeddings", True):
    refuse("tie_word_embeddings", "Hugging Face GPT-2 checkpoints tie lm_head to wte; an untied head is not read")
  try:
    return ModelConfig(
      family="gpt2",
      V=config["vocab_size"],
      D=config["n_embd"],
      H=config["n_head"],
      L=config["n_layer"],
      T=config["n_positions"],
      F=config.get("n_inner") or 4 * config["n_embd"],
      eps=float(config.get("layer_norm_epsilon", 1e-5)),
      internal_norm="plain",
      final_norm="plain",
      tie_embeddings=True,
      logits_bias=False,
      init_std=float(config.get("initializer_range", 0.02)),
      dtype="float32",
      param_dtype="float32",
    )
  except ValueError as e:
    raise ValueError(f"{path} describes a model this code cannot build: {e}") from e


def read_tensors(path: Path) -> dict[str, np.ndarray]:
  """Every tensor of a safetensors file as numpy, names without the `transformer.` prefix."""
  try:
    with safetensors.safe_open(str(path), framework="np") as f:
      raw = {name: f.get_tensor(name) for name in f.keys()}
  except safetensors.SafetensorError as e:
    raise ValueError(f"{path} is not a readable safetensors file (corrupted or truncated?): {e}") from e
  tensors: dict[str, np.ndarray] = {}
  for name, x in raw.items():
    short = name.removeprefix(PREFIX)
    if short in tensors:
      raise ValueError(f"{path} holds {short} twice, with and without the {PREFIX!r} prefix")
    tensors[short] = x
  return tensors


# ---------------------------------------------------------------------------------------------------- import


def load_gpt2(source: str | os.PathLike) -> tuple[PyTree, ModelConfig]:
  """Reads a Hugging Face GPT-2 (local directory or hub name) as ({"params", "calib"} numpy arrays, ModelConfig)."""
  directory = resolve(source, MODEL_FILES, "load_gpt2")
  config = read_config(directory / CONFIG_FILE)
  cfg = model_config(config, directory / CONFIG_FILE)
  weights = directory / WEIGHTS_FILE
  params = import_params(read_tensors(weights), cfg, config, weights)
  variables = {"params": params, "calib": initial_calib(cfg)}
  check_matches(variables, cfg)  # the table covers every model parameter, each with the model's shape
  return variables, cfg


def import_params(tensors: dict[str, np.ndarray], cfg: ModelConfig, config: dict, path: Path) -> PyTree:
  """Model params from checkpoint tensors through TABLE; every tensor is used, ignored by name, or an error."""
  problems, flat = [], {}
  dtype = np.dtype(cfg.param_dtype)
  for entry in entries(cfg):
    x = tensors.get(entry.hf)
    source = _shape_source(config, entry.rule.dims)
    if x is None:
      problems.append(f"{entry.hf} is missing (expected shape {entry.shape} from config.json {source})")
    elif tuple(x.shape) != entry.shape:
      problems.append(f"{entry.hf} has shape {tuple(x.shape)}, expected {entry.shape} from config.json {source}")
    elif not jnp.issubdtype(x.dtype, jnp.floating):  # jnp's knows bfloat16
      problems.append(f"{entry.hf} has dtype {x.dtype}, expected floating point")
    else:
      flat[entry.path] = np.ascontiguousarray(entry.rule.to_model(x, cfg).astype(dtype, copy=False))
  known = {entry.hf for entry in entries(cfg)}
  unexpected = sorted(n for n in tensors if n not in known and not IGNORED.fullmatch(n))
  if unexpected:
    problems.append(
      f"unexpected tensor(s) {', '.join(unexpected[:6])}{' …' if len(unexpected) > 6 else ''} "
      f"(config.json n_layer={cfg.L}; GPT-2 has wte, wpe, h.0 … h.{cfg.L - 1}, ln_f)"
    )
  if problems:
    shown = "; ".join(problems[:6]) + (f"; … {len(problems) - 6} more" if len(problems) > 6 else "")
    raise ValueError(f"{path} does not match its config.json: {shown}")
  return traverse_util.unflatten_dict(flat)


def initial_calib(cfg: ModelConfig) -> PyTree:
  """The `calib` collection as `init` makes it (the pre-logit monitor), as numpy arrays."""
  # Jitted and returning calib alone: XLA drops the parameters' initialisation, so nothing large is made.
  calib = jax.jit(lambda key: nn.unbox(init(cfg, key, length=1))["calib"])(jax.random.key(0))
  return jax.tree.map(np.asarray, calib)


# ---------------------------------------------------------------------------------------------------- export


def exportable(cfg: ModelConfig) -> None:
  """Raises ValueError saying why a model cannot be written as a Hugging Face GPT-2, if it cannot."""
  if cfg.family != "gpt2":
    raise ValueError(f"model.family={cfg.family!r}: only gpt2-family models are Hugging Face GPT-2 models")
  for field in ("internal_norm", "final_norm"):
    mode = getattr(cfg, field)
    if mode == "identity":
      raise ValueError(
        f"model.{field}='identity': Hugging Face GPT-2 has no identity-norm option (every block has "
        "ln_1 and ln_2, the model ln_f), so a folded model cannot be written as GPT-2"
      )
    if mode != "plain":
      what = "a tapered norm (its g = 0 map c·h̄·γ̃)" if mode in param_paths.CALIBRATED_MODES else "this norm"
      raise ValueError(
        f"model.{field}={mode!r}: {what} is not a LayerNorm, and Hugging Face GPT-2 has LayerNorms "
        "only; save_gpt2 writes models whose norms are plain"
      )
  if cfg.logits_bias:
    raise ValueError("model.logits_bias=True: Hugging Face GPT-2 has no separate head bias")
  if not cfg.tie_embeddings:
    raise ValueError(
      "model.tie_embeddings=False: Hugging Face GPT-2 ties lm_head to wte; an untied head cannot be written"
    )


def hf_config(cfg: ModelConfig, eos_id: int | None = None) -> dict:
  """A GPT2Config transformers can read, reproducing `cfg` (no dropout: the model has none)."""
  if eos_id is None and cfg.V == 50257:
    eos_id = 50256  # GPT-2's <|endoftext|>
  return {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "activation_function": ACTIVATION,
    "vocab_size": cfg.V,
    "n_positions": cfg.T,
    "n_ctx": cfg.T,
    "n_embd": cfg.D,
    "n_head": cfg.H,
    "n_layer": cfg.L,
    "n_inner": None if cfg.mlp_dim == 4 * cfg.D else cfg.mlp_dim,
    "layer_norm_epsilon": cfg.eps,
    "initializer_range": cfg.init_std,
    "tie_word_embeddings": True,
    "attn_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "use_cache": True,
    "bos_token_id": eos_id,
    "eos_token_id": eos_id,
  }


def save_gpt2(variables: PyTree, model_cfg: Any, directory: str | os.PathLike, eos_id: int | None = None) -> epath.Path:
  """Writes a LayerNorm gpt2 model as a Hugging Face GPT-2 directory (config.json, model.safetensors), local or a
  URL; returns it."""
  cfg = ModelConfig.from_config(model_cfg)
  exportable(cfg)
  plain = nn.unbox(variables)
  check_matches(plain, cfg)
  params = traverse_util.flatten_dict(plain["params"])
  tensors = {
    e.hf: np.ascontiguousarray(e.rule.to_hf(np.asarray(jax.device_get(params[e.path])), cfg).astype(np.float32))
    for e in entries(cfg)
  }
  directory = run_files.workdir_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  with run_files.atomic_path(directory / WEIGHTS_FILE) as tmp:
    safetensors.numpy.save_file(tensors, tmp, metadata={"format": "pt"})  # transformers wants format=pt
    os.chmod(tmp, 0o644)  # safetensors creates it owner-only
  run_files.write_json_atomically(directory / CONFIG_FILE, hf_config(cfg, eos_id))
  return directory
