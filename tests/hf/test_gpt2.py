"""Hugging Face GPT-2 import/export (against a committed tiny GPT-2 and its PyTorch logits) and the GPT-2 tokenizer."""

import json
import shutil
from pathlib import Path

import flax.linen as nn
import huggingface_hub
import jax
import numpy as np
import pytest
import safetensors.numpy
from flax import traverse_util
from huggingface_hub import errors as hub_errors
from tokenizers import pre_tokenizers

from tapernorm_jax.hf import gpt2, hub
from tapernorm_jax.model import ModelConfig, Transformer, init, param_paths
from tapernorm_jax.tokenizers.gpt2_bpe import GPT2Tokenizer
from locations import SHARED_DATA, FIXTURES

FIXTURE = FIXTURES / "tiny_gpt2"  # made by scripts/make_gpt2_fixture.py
GPT2_DATA = SHARED_DATA / "gpt2"  # GPT-2's real vocab.json, merges.txt
needs_gpt2_data = pytest.mark.skipif(not (GPT2_DATA / "vocab.json").is_file(), reason=f"no {GPT2_DATA}")
TEXTS = [
  "Hello world",
  "Once upon a time, there was a little cat.\nIt liked milk.\n\n",
  "  leading and trailing spaces  ",
  "unicode: héllo wörld — naïve café, 日本語, emoji 🙂",
  "tabs\tand\r\nCRLF",
  "a literal <|endoftext|> stays text",
]


@pytest.fixture(scope="module")
def loaded() -> tuple[dict, ModelConfig]:
  return gpt2.load_gpt2(str(FIXTURE))


@pytest.fixture(scope="module")
def hf_config() -> dict:
  return json.loads((FIXTURE / gpt2.CONFIG_FILE).read_text())


@pytest.fixture(scope="module")
def hf_tensors() -> dict[str, np.ndarray]:
  return safetensors.numpy.load_file(str(FIXTURE / gpt2.WEIGHTS_FILE))


def _copy_fixture(tmp_path: Path, tensors: dict[str, np.ndarray] | None = None, config: dict | None = None) -> Path:
  """A copy of the fixture directory with its tensors and/or config replaced."""
  out = tmp_path / "ckpt"
  shutil.copytree(FIXTURE, out)
  if tensors is not None:
    safetensors.numpy.save_file(tensors, str(out / gpt2.WEIGHTS_FILE), metadata={"format": "pt"})
  if config is not None:
    (out / gpt2.CONFIG_FILE).write_text(json.dumps(config))
  return out


def _initial_variables(cfg: ModelConfig) -> dict:
  """`init`'s variables, compiled without XLA optimisation (its random initialisers take ~10 s to optimise here)."""
  lowered = jax.jit(lambda key: nn.unbox(init(cfg, key))).lower(jax.random.key(0))
  return lowered.compile(compiler_options={"xla_backend_optimization_level": 0})(jax.random.key(0))


def test_logits_match_pytorch_reference(loaded):
  variables, cfg = loaded
  reference = np.load(FIXTURE / "reference_logits.npz")
  logits_BxTxV = np.asarray(jax.jit(Transformer(cfg).apply)(variables, reference["ids"]))
  expected_BxTxV = reference["logits"]
  assert logits_BxTxV.shape == expected_BxTxV.shape
  assert np.abs(logits_BxTxV - expected_BxTxV).max() / np.abs(expected_BxTxV).max() <= 1e-5


def test_model_config_reproduces_config_json(loaded, hf_config):
  _, cfg = loaded
  assert (cfg.family, cfg.V, cfg.D, cfg.H, cfg.L, cfg.T) == (
    "gpt2",
    hf_config["vocab_size"],
    hf_config["n_embd"],
    hf_config["n_head"],
    hf_config["n_layer"],
    hf_config["n_positions"],
  )
  assert cfg.F == cfg.mlp_dim == (hf_config["n_inner"] or 4 * hf_config["n_embd"])
  assert cfg.eps == hf_config["layer_norm_epsilon"]
  assert (cfg.internal_norm, cfg.final_norm, cfg.tie_embeddings, cfg.logits_bias) == ("plain", "plain", True, False)


def test_every_parameter_comes_from_the_checkpoint(loaded, hf_tensors):
  variables, cfg = loaded
  initial = traverse_util.flatten_dict(jax.tree.map(np.asarray, _initial_variables(cfg)))
  loaded_flat = traverse_util.flatten_dict(variables)
  assert set(loaded_flat) == set(initial)
  for path, x in loaded_flat.items():
    assert x.shape == initial[path].shape and x.dtype == initial[path].dtype, path
    if path[0] == "params":
      assert not np.any(x == initial[path]), f"{path} still holds init values"
    else:
      assert np.array_equal(x, initial[path]), path  # calib: the pre-logit monitor's init values
  used = {e.hf for e in gpt2.entries(cfg)}
  assert used == {n.removeprefix(gpt2.PREFIX) for n in hf_tensors}
  assert len(used) == len(traverse_util.flatten_dict(variables["params"]))


def test_qkv_and_heads_split_order(loaded, hf_tensors):
  variables, cfg = loaded
  K, b = cfg.D // cfg.H, 1
  attn = variables["params"][param_paths.block(b)][param_paths.ATTN]
  c_attn_Dx3D = hf_tensors[f"{gpt2.PREFIX}h.{b}.attn.c_attn.weight"]
  c_attn_3D = hf_tensors[f"{gpt2.PREFIX}h.{b}.attn.c_attn.bias"]
  c_proj_DxD = hf_tensors[f"{gpt2.PREFIX}h.{b}.attn.c_proj.weight"]
  for s in range(3):  # q, k, v
    for h in range(cfg.H):
      cols = slice(s * cfg.D + h * K, s * cfg.D + (h + 1) * K)
      np.testing.assert_array_equal(attn[param_paths.QKV][:, s, h], c_attn_Dx3D[:, cols])
      np.testing.assert_array_equal(attn[param_paths.QKV_BIAS][s, h], c_attn_3D[cols])
  for h in range(cfg.H):
    np.testing.assert_array_equal(attn[param_paths.ATTN_OUT][h], c_proj_DxD[h * K : (h + 1) * K])


def test_buffers_and_tied_head_are_ignored_and_prefix_is_optional(tmp_path, loaded, hf_tensors):
  variables, _ = loaded
  tensors = {n.removeprefix(gpt2.PREFIX): x for n, x in hf_tensors.items()}  # hub files carry no prefix
  tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
  tensors["h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
  tensors["lm_head.weight"] = tensors["wte.weight"]
  again, _ = gpt2.load_gpt2(str(_copy_fixture(tmp_path, tensors=tensors)))
  jax.tree.map(np.testing.assert_array_equal, again, variables)


@pytest.mark.parametrize(
  "change, message",
  [
    (lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"), r"h\.1\.mlp\.c_fc\.bias is missing \(expected shape \(256,\)"),
    (
      lambda t: t.update({"transformer.h.2.mlp.c_fc.weight": np.zeros((64, 250), np.float32)}),
      r"h\.2\.mlp\.c_fc\.weight has shape \(64, 250\), expected \(64, 256\) from config.json n_embd=64",
    ),
    (
      lambda t: t.update({"transformer.h.0.attn.c_attn.weight": np.zeros((64, 64), np.float32)}),
      r"h\.0\.attn\.c_attn\.weight has shape \(64, 64\), expected \(64, 192\)",
    ),
    (
      lambda t: t.update({"transformer.h.3.ln_1.weight": np.ones(64, np.float32)}),
      r"unexpected tensor\(s\) h\.3\.ln_1\.weight \(config.json n_layer=3",
    ),
  ],
)
def test_mismatched_checkpoint_names_the_tensor(tmp_path, hf_tensors, change, message):
  tensors = dict(hf_tensors)
  change(tensors)
  with pytest.raises(ValueError, match=message):
    gpt2.load_gpt2(str(_copy_fixture(tmp_path, tensors=tensors)))


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("activation_function", "relu", r"activation_function=\"relu\""),
    ("n_layer", 4, r"h\.3\.ln_1\.weight is missing"),
    ("n_embd", None, r"n_embd=null: missing"),
    ("model_type", "llama", r"model_type=\"llama\""),
    ("scale_attn_by_inverse_layer_idx", True, r"scale_attn_by_inverse_layer_idx=true"),
  ],
)
def test_unsupported_config_names_the_field(tmp_path, hf_config, field, value, message):
  with pytest.raises(ValueError, match=message):
    gpt2.load_gpt2(str(_copy_fixture(tmp_path, config={**hf_config, field: value})))


@pytest.mark.parametrize("cut", [lambda data: data[: len(data) // 2], lambda data: data[:20], lambda data: b"x" * 100])
def test_corrupted_safetensors_is_reported_with_its_path(tmp_path, cut):
  directory = _copy_fixture(tmp_path)
  weights = directory / gpt2.WEIGHTS_FILE
  weights.write_bytes(cut(weights.read_bytes()))
  with pytest.raises(ValueError, match=rf"{weights} is not a readable safetensors file \(corrupted or truncated"):
    gpt2.load_gpt2(str(directory))


def test_missing_files_and_bad_sources(tmp_path):
  (tmp_path / gpt2.CONFIG_FILE).write_text("{}")
  with pytest.raises(FileNotFoundError, match=rf"{tmp_path} has no model.safetensors"):
    gpt2.load_gpt2(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="neither a local directory nor a Hugging Face Hub name"):
    gpt2.load_gpt2(str(tmp_path / "no" / "such" / "dir"))


@pytest.mark.parametrize(
  "load, files", [(gpt2.load_gpt2, "config.json model.safetensors"), (GPT2Tokenizer, "vocab.json merges.txt")]
)
def test_offline_hub_name_says_how_to_pass_a_directory(tmp_path, monkeypatch, load, files):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HOME", str(tmp_path))
  calls = []

  def offline(repo_id: str, **kwargs) -> str:
    calls.append((repo_id, kwargs))
    raise hub_errors.LocalEntryNotFoundError("outgoing traffic has been disabled")

  monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
  with pytest.raises(hub.HubUnavailableError) as info:
    load("openai-community/gpt2-medium")
  message = str(info.value)
  assert "'openai-community/gpt2-medium'" in message and "LocalEntryNotFoundError" in message
  assert f"hf download openai-community/gpt2-medium {files} --local-dir DIR" in message
  assert "('DIR')" in message
  assert calls == [("openai-community/gpt2-medium", {"allow_patterns": files.split()})]


def test_save_round_trip_and_hf_layout(tmp_path, loaded, hf_config, hf_tensors):
  variables, cfg = loaded
  out = gpt2.save_gpt2(variables, cfg, tmp_path / "export")
  again, cfg_again = gpt2.load_gpt2(str(out))
  assert cfg_again == cfg
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b, strict=True), again, variables)
  written = safetensors.numpy.load_file(str(out / gpt2.WEIGHTS_FILE))
  assert set(written) == {n.removeprefix(gpt2.PREFIX) for n in hf_tensors}  # hub names: no prefix
  for name, x in hf_tensors.items():
    np.testing.assert_array_equal(written[name.removeprefix(gpt2.PREFIX)], x, strict=True)
  config = json.loads((out / gpt2.CONFIG_FILE).read_text())
  assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
  assert config["tie_word_embeddings"] is True
  for field in (
    "vocab_size",
    "n_positions",
    "n_embd",
    "n_head",
    "n_layer",
    "n_inner",
    "layer_norm_epsilon",
    "activation_function",
  ):
    assert config[field] == hf_config[field], field


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(internal_norm="taper"), "model.internal_norm='taper': a tapered norm"),
    (dict(final_norm="fixed"), "model.final_norm='fixed': a tapered norm"),
    (dict(internal_norm="dyt"), "model.internal_norm='dyt': this norm is not a LayerNorm"),
    (dict(final_norm="repbn"), "model.final_norm='repbn': this norm is not a LayerNorm"),
    (dict(internal_norm="identity"), "model.internal_norm='identity': Hugging Face GPT-2 has no identity-norm"),
    (
      dict(internal_norm="identity", final_norm="identity", tie_embeddings=False, logits_bias=True),  # as fold makes
      "model.internal_norm='identity': Hugging Face GPT-2 has no identity-norm",
    ),
    (dict(tie_embeddings=False), "ties lm_head to wte"),
    (dict(tie_embeddings=False, logits_bias=True), "no separate head bias"),
    (dict(family="llama"), "only gpt2-family"),
  ],
)
def test_save_refuses_what_gpt2_cannot_express(tmp_path, loaded, changes, message):
  variables, cfg = loaded
  with pytest.raises(ValueError, match=message):
    gpt2.save_gpt2(variables, cfg.replace(**changes), tmp_path)
  assert not any(tmp_path.iterdir())


def test_tokenizer_on_a_tiny_byte_level_vocabulary(tmp_path):
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  vocab = {c: i for i, c in enumerate(alphabet)} | {"he": len(alphabet), "<|endoftext|>": len(alphabet) + 1}
  (tmp_path / "vocab.json").write_text(json.dumps(vocab))
  (tmp_path / "merges.txt").write_text("#version: 0.2\nh e\n")
  tok = GPT2Tokenizer(tmp_path)
  assert (tok.vocab_size, tok.eos_id, tok.bos_id) == (258, 257, 257)
  assert tok.encode("hehe") == [256, 256]
  for text in TEXTS:
    assert tok.decode(tok.encode(text)) == text


@needs_gpt2_data
def test_gpt2_tokenizer_ids_and_round_trip():
  tok = GPT2Tokenizer(str(GPT2_DATA))
  assert tok.encode("Hello world") == [15496, 995]
  assert (tok.eos_id, tok.bos_id, tok.vocab_size) == (50256, 50256, 50257)
  assert tok.decode([15496, 995]) == "Hello world"
  for text in TEXTS:
    ids = tok.encode(text)
    assert tok.eos_id not in ids and tok.decode(ids) == text


@needs_gpt2_data
def test_encode_documents_puts_eot_after_every_document():
  tok = GPT2Tokenizer(str(GPT2_DATA))
  ids = tok.encode_documents(TEXTS)
  assert ids == [i for text in TEXTS for i in tok.encode(text) + [tok.eos_id]]
  assert ids.count(tok.eos_id) == len(TEXTS) and ids[-1] == tok.eos_id
  assert tok.decode(ids) == "".join(TEXTS)
  assert tok.encode_documents([]) == []
