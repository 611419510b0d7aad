"""Export round trip, the self-contained export directory, and generate.py's two ways in (export, checkpoint)."""

import hashlib
import io
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import sentencepiece as spm

from configs import base
from tapernorm_jax.storage import unreadable
from tapernorm_jax.inference import decode, export, forms, loading
from tapernorm_jax.inference import prompts as prompts_lib
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.taper.fold import fold
from tapernorm_jax.tokenizers.sentencepiece import SentencePiece
from model_helpers import init_variables, logits_at, perturbed_variables
from locations import ROOT

TEXT = [
  "Once upon a time there was a little cat named Tom.",
  "Tom liked to play in the park with his red ball.",
  "One day the ball rolled away and Tom was sad.",
  "His friend Lily found the ball and they were happy.",
]
V = 80
# Imports an export-only process must not need: the training code, the optimiser and the data pipeline.
TRAINING_ONLY = [
  "optax",
  "grain",
  "tensorflow_datasets",
  "tapernorm_jax.train",
  "tapernorm_jax.data",
  "tapernorm_jax.taper.calibration",
  "tapernorm_jax.taper.losses",
  "tapernorm_jax.taper.schedules",
]


def _cfg(family: str = "llama", **changes) -> ModelConfig:
  return ModelConfig(
    **{
      **dict(
        family=family,
        V=V,
        D=32,
        H=4,
        L=2,
        T=32,
        internal_norm="taper",
        final_norm="taper",
        init_std=0.2,
        tie_embeddings=False,
      ),
      **changes,
    }
  )


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> str:
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(TEXT * 20), model_writer=model, vocab_size=V, model_type="bpe", minloglevel=2
  )
  path = tmp_path_factory.mktemp("tok") / "sp.model"
  path.write_bytes(model.getvalue())
  return str(path)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_export_round_trip_through_orbax_and_safetensors(family, tmp_path, tokenizer_file):
  cfg = _cfg(family)
  variables = perturbed_variables(cfg)
  directory = export.save(tmp_path / "export", variables, cfg, tokenizer=SentencePiece.from_file(tokenizer_file))
  assert sorted(os.listdir(directory)) == [
    "config.json",
    "manifest.json",
    "model.safetensors",
    "tokenizer",
    "variables",
  ]
  folded, folded_cfg = fold(variables, cfg)
  tokens_BxT = jax.random.randint(jax.random.key(3), (2, 12), 0, V)
  reference = logits_at(cfg, variables, tokens_BxT, 0.0)
  for source in ("orbax", "safetensors"):
    loaded = export.load(directory, source)
    assert loaded.model_cfg == folded_cfg and loaded.info["folded"]
    jax.tree.map(np.testing.assert_array_equal, loaded.variables, folded)
    np.testing.assert_allclose(
      logits_at(loaded.model_cfg, loaded.variables, tokens_BxT),
      reference,
      rtol=1e-5,
      atol=1e-5 * float(np.abs(reference).max()),
    )
  with open(directory / "config.json") as f:
    assert json.load(f)["model"]["internal_norm"] == "identity"
  names = set(export.flatten(folded))
  assert "params.block_0.attn.qkv" in names and "params.head" in names


def test_a_damaged_export_file_is_named_before_it_is_loaded(tmp_path, tokenizer_file):
  cfg = _cfg()
  directory = export.save(
    tmp_path / "export", perturbed_variables(cfg), cfg, tokenizer=SentencePiece.from_file(tokenizer_file)
  )
  recorded = json.loads((directory / "manifest.json").read_text())["files"]
  weights = directory / "model.safetensors"
  assert recorded["model.safetensors"] == {
    "size": weights.stat().length,
    "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
  }
  assert any(name.startswith("variables/") for name in recorded) and "tokenizer/tokenizer.model" in recorded
  data = bytearray(weights.read_bytes())
  data[-1] ^= 0x01  # one flipped bit in the last weight: safetensors itself would load it
  weights.write_bytes(bytes(data))
  with pytest.raises(unreadable.DamagedCheckpointError) as e:
    export.load(directory, "safetensors")
  assert str(e.value) == (
    f"the export in {directory} is damaged: model.safetensors does not match the SHA-256 "
    "manifest.json recorded; export the model again, or load it with source='orbax'"
  )
  with pytest.warns(RuntimeWarning, match="model.safetensors does not match .*; loading its intact variables copy"):
    assert export.load(directory, "orbax").model_cfg.D == 32  # the other copy is intact: loaded, with a warning
  (directory / "tokenizer" / "tokenizer.model").write_bytes(b"")
  with pytest.raises(
    unreadable.DamagedCheckpointError,
    match=r"tokenizer/tokenizer.model has 0 bytes, manifest.json "
    r"recorded [\d,]+; export the model again$",
  ):
    export.load(directory, "orbax")


def test_a_baseline_model_exports_unfolded(tmp_path):
  cfg = _cfg(internal_norm="plain", final_norm="plain")
  loaded = export.load(export.save(tmp_path / "export", init_variables(cfg), cfg))
  assert loaded.model_cfg == cfg and not loaded.info["folded"] and loaded.tokenizer_dir is None


def test_export_errors_are_clear(tmp_path):
  cfg = _cfg()
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "x").write_text("x")
  with pytest.raises(FileExistsError, match="not empty"):
    export.save(tmp_path / "busy", perturbed_variables(cfg), cfg)
  assert os.listdir(tmp_path / "busy") == ["x"]
  complete = export.save(tmp_path / "done", perturbed_variables(cfg), cfg)
  with pytest.raises(FileExistsError, match="holds a complete export; give a new directory"):
    export.save(complete, init_variables(cfg), cfg)
  (complete / "config.json").unlink()  # as a save killed before its last write leaves it, with a temporary file
  (complete / "model.safetensors").rename(complete / "model.safetensors.tmp-123")
  with pytest.warns(RuntimeWarning, match="holds an export that was interrupted .*; writing it again"):
    export.save(complete, init_variables(cfg), cfg)
  assert sorted(os.listdir(complete)) == ["config.json", "manifest.json", "model.safetensors", "variables"]
  np.testing.assert_array_equal(
    export.load(complete).variables["params"]["embed"], nn.unbox(init_variables(cfg))["params"]["embed"]
  )
  with pytest.raises(FileNotFoundError, match="is not a tapernorm_jax.export directory"):
    export.load(tmp_path)
  with pytest.raises(ValueError, match="do not match the model config"):
    export.save(
      tmp_path / "bad", perturbed_variables(cfg), cfg.replace(D=64, internal_norm="plain", final_norm="plain")
    )


def test_generate_from_an_export_in_a_process_without_training_code(tmp_path, tokenizer_file):
  cfg = _cfg()
  variables = perturbed_variables(cfg)
  directory = export.save(tmp_path / "export", variables, cfg, tokenizer=SentencePiece.from_file(tokenizer_file))
  blocker = f"import sys\nfor m in {TRAINING_ONLY!r}:\n  sys.modules[m] = None\n"
  script = blocker + (
    "import runpy\nsys.argv = ['generate', '--workdir={d}', '--prompt=Once upon a time', "
    "'--prompt=Tom', '--max_new_tokens=6']\n"
    "runpy.run_module('experiments.generate', run_name='__main__')\n"
  ).format(d=directory)
  result = subprocess.run(
    [sys.executable, "-c", script],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""},
  )
  assert result.returncode == 0, result.stderr[-3000:]
  sp = spm.SentencePieceProcessor(model_file=tokenizer_file)
  folded, folded_cfg = fold(variables, cfg)
  prompts = [[sp.bos_id()] + sp.encode(t) for t in ("Once upon a time", "Tom")]
  expected = prompts_lib.continue_prompts(folded, folded_cfg, prompts, 6, eos_id=sp.eos_id())
  for prompt, new in zip(prompts, expected):
    assert sp.decode(prompt) + sp.decode(new) in result.stdout


def _write_training_checkpoint(workdir, cfg: ModelConfig, variables, step: int) -> None:
  """A checkpoint in the training job's layout: checkpoints/<step>/{state, data} and the resolved config.json."""
  run_cfg = base.get_config("all_taper")
  run_cfg.model.update({k: getattr(cfg, k) for k in run_cfg.model})
  run_cfg.data.update(source="text", text_train=str(workdir / "missing.txt"), data_dir=str(workdir / "data"))
  (workdir / "config.json").write_text(run_cfg.to_json_best_effort())
  params = variables["params"]
  state = {
    "params": params,
    "opt_state": optax.adam(1e-3).init(params),
    "calib": variables["calib"],
    "step": np.int32(step),
  }
  with ocp.CheckpointManager(workdir / "checkpoints") as manager:
    manager.save(
      step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave({"position": 5}))
    )
    manager.wait_until_finished()


def test_generate_restores_params_and_calib_from_the_latest_training_checkpoint(tmp_path):
  cfg = _cfg()
  old, new = perturbed_variables(cfg), perturbed_variables(cfg.replace(init_std=0.3))
  _write_training_checkpoint(tmp_path, cfg, old, 10)
  _write_training_checkpoint(tmp_path, cfg, new, 20)
  restored, run_cfg = loading.load_checkpoint(str(tmp_path))
  assert run_cfg["restored_step"] == 20 and set(restored) == {"params", "calib"}
  jax.tree.map(np.testing.assert_array_equal, restored, new)
  at_10, _ = loading.load_checkpoint(str(tmp_path), step=10)
  jax.tree.map(np.testing.assert_array_equal, at_10, old)
  with pytest.raises(FileNotFoundError, match="no checkpoint at step 15"):
    loading.load_checkpoint(str(tmp_path), step=15)
  loaded = loading.load(str(tmp_path))
  variables, folded_cfg = forms.inference_form(loaded.variables, loaded.model_cfg)
  prompts = [[1, 5, 7, 9], [1, 4]]
  got = prompts_lib.continue_prompts(variables, folded_cfg, prompts, 5)
  prompt_BxP, lengths_B = decode.pad_prompts(prompts)
  want = decode.generate(new, cfg, prompt_BxP, lengths_B, jax.random.key(0), max_new_tokens=5)
  assert got == np.asarray(want).tolist()


@pytest.mark.slow
def test_generate_cli_after_a_real_training_run(tmp_path):
  data_dir, workdir = tmp_path / "data", tmp_path / "run"
  overrides = {
    "model.D": 32,
    "model.H": 4,
    "model.L": 2,
    "model.T": 32,
    "model.V": 512,
    "train.steps": 12,
    "train.batch_size": 8,
    "train.eval_batches": 1,
    "checkpoint.every": 6,
    "taper.gate_warmup_frac": 0.25,
    "data.synthetic_train_stories": 400,
    "data.synthetic_valid_stories": 60,
    "data.data_dir": str(data_dir),
  }
  flags = [f"--config.{k}={v}" for k, v in overrides.items()]
  subprocess.run(
    [sys.executable, "-m", "experiments.tinystories", "--config=configs/all_taper.py", f"--workdir={workdir}", *flags],
    cwd=ROOT,
    check=True,
    capture_output=True,
    timeout=600,
  )
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.generate",
      f"--workdir={workdir}",
      "--prompt=Once upon a time",
      "--max_new_tokens=8",
      f"--export_dir={tmp_path / 'export'}",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Once upon a time" in result.stdout and export.is_export(tmp_path / "export")
  assert export.load_tokenizer(export.load(tmp_path / "export")).vocab_size == 512


GPT2_FILES = os.path.join(ROOT, "..", "shared", "data", "gpt2")


@pytest.mark.skipif(not os.path.isdir(GPT2_FILES), reason="../shared/data/gpt2 is absent")
def test_an_export_carries_the_gpt2_tokenizer(tmp_path):
  from tapernorm_jax.tokenizers.gpt2_bpe import GPT2Tokenizer

  cfg = _cfg("gpt2", internal_norm="plain", final_norm="plain")
  directory = export.save(tmp_path / "export", init_variables(cfg), cfg, tokenizer=GPT2Tokenizer(GPT2_FILES))
  loaded = export.load_tokenizer(export.load(directory))
  assert loaded.kind == "gpt2" and loaded.encode("Hello world") == [15496, 995] and loaded.eos_id == 50256
