"""Every kind of user mistake gets one line on stderr that names the flag or field and the fix, a non-zero exit, no
traceback, and leaves the run directory as it was; library functions refuse inputs outside their domain by name."""

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from tapernorm_jax import cli
from tapernorm_jax.data import stories, text_files
from tapernorm_jax.inference import decode, export, prompts
from tapernorm_jax.model import ModelConfig, Transformer, init, sharding
from tapernorm_jax.tokenizers import sentencepiece
from tapernorm_jax.train.run_dir import RunDir
from tapernorm_jax.train.checkpoint import Checkpointer, DamagedCheckpointError
from tapernorm_jax.train.trainer import Trainer
from locations import ROOT

TINY = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 2,
  "model.T": 32,
  "model.V": 512,
  "train.steps": 24,
  "train.batch_size": 8,
  "checkpoint.every": 6,
  "taper.gate_warmup_frac": 0.25,
  "taper.taper_end": 18,
}


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess:
  """`python -m experiments.<module> ARGS` from the repository root."""
  return subprocess.run(
    [sys.executable, "-m", f"experiments.{module}", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
  )


def one_line_error(result: subprocess.CompletedProcess, code: int = 2) -> str:
  """The single `error: ...` line of a refused command (the last line of stderr), after checking the exit code and
  that no traceback was printed."""
  assert result.returncode == code, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and result.stderr.rstrip().splitlines()[-1] == errors[0], result.stderr[-3000:]
  return errors[0]


def snapshot(directory: str) -> dict[str, tuple[int, int]]:
  """(size, mtime) of every file and directory under `directory`, by relative path."""
  out = {}
  for parent, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(parent, name)
      out[os.path.relpath(path, directory)] = (os.path.getsize(path), os.stat(path).st_mtime_ns)
  return out


def tiny_flags(data_dir: str) -> list[str]:
  return [f"--config.{k}={v}" for k, v in {**TINY, "data.data_dir": data_dir}.items()]


@pytest.fixture
def run_dir(tmp_path) -> str:
  """A run directory with a file in it, to check that a refused command changes nothing there."""
  path = tmp_path / "run"
  path.mkdir()
  (path / "notes.txt").write_text("keep me")
  return str(path)


@pytest.mark.parametrize(
  "args,fragments",
  [
    (
      ["--config.train.stepz=10"],
      ["--config.train.stepz=10: config.train has no field 'stepz'", "did you mean --config.train.steps?"],
    ),
    (
      ["--config=configs/all_tapr.py"],
      ["--config=configs/all_tapr.py: no such file", "did you mean --config=configs/all_taper.py?"],
    ),
    (["--config=configs/all_taper.py:size=2m"], ["--config=configs/all_taper.py:size=2m: size='2m' is not one of"]),
    (
      ["--config.model.T=64", "--config.data.seq_len=32"],
      ["--config.model.T=64 and --config.data.seq_len=32", "one shared value", "give only one"],
    ),
    (["--config.model.H=5"], ["model.H=5: the number of heads must divide model.D=64"]),
    (["--config.model.remat=fast"], ["model.remat='fast': choose one of ('none', 'full', 'save_matmuls')"]),
    (["--workdr=x"], ["--workdr: no such flag; did you mean --workdir?"]),
    (["--config.mesh.process_id=1"], ["mesh.process_id=1 without mesh.distributed=True"]),
  ],
  ids=[
    "unknown-field",
    "missing-file",
    "bad-file-argument",
    "shared-field-twice",
    "invalid-value",
    "bad-remat-policy",
    "unknown-flag",
    "multi-host-field-alone",
  ],
)
def test_config_and_flag_mistakes_are_one_line_naming_the_flag(run_dir, args, fragments):
  before = snapshot(run_dir)
  line = one_line_error(run_cli("tinystories", *args, f"--workdir={run_dir}"))
  for fragment in fragments:
    assert fragment in line
  assert snapshot(run_dir) == before


def test_the_gpt2_demo_names_its_flag_mistakes_before_training(tmp_path):
  workdir = tmp_path / "demo"
  line = one_line_error(run_cli("gpt2_demo", "--filter_eval_text", f"--workdir={workdir}"))
  assert "--filter_eval_text filters --eval_text's windows; give --eval_text=PATH too" in line
  assert "--seeds=0,x: give comma-separated non-negative integers" in one_line_error(
    run_cli("gpt2_demo", "--seeds=0,x", f"--workdir={workdir}")
  )
  assert not workdir.exists()
  (workdir / "pretrain").mkdir(parents=True)  # a finished pretraining run, evaluated on its validation split only
  (workdir / "pretrain" / "results.json").write_text('{"eval_losses": {"val": 0.8}, "final_val_loss": 0.8}')
  line = one_line_error(run_cli("gpt2_demo", f"--eval_text={workdir}/x.txt", f"--workdir={workdir}"))
  assert f"{workdir}/pretrain was evaluated on val, not on text, val: give the --eval_text" in line


def test_a_workdir_that_is_a_file_is_refused_and_left_alone(tmp_path):
  path = tmp_path / "results.txt"
  path.write_text("not a directory")
  before = snapshot(str(tmp_path))
  line = one_line_error(run_cli("tinystories", f"--workdir={path}"))
  assert line == f"error: --workdir={path} is a file; give a directory"
  assert snapshot(str(tmp_path)) == before


def test_a_benchmark_setting_out_of_range_names_its_flag():
  assert one_line_error(run_cli("benchmark_train", "--sizes=1m,2m")).startswith("error: --sizes=1m,2m: choose from")


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory) -> str:
  """An export of a random 1-layer llama model (V = 64, T = 16) without a tokenizer."""
  cfg = ModelConfig(family="llama", V=64, D=16, H=2, L=1, T=16)
  return str(export.save(tmp_path_factory.mktemp("export") / "tiny", init(cfg, jax.random.key(0)), cfg))


@pytest.mark.parametrize(
  "args,expected",
  [
    (["--tokens=1,2,3", "--temperature=-1"], "error: --temperature=-1.0: must be a finite number >= 0"),
    (["--tokens=1,2,3", "--temperature=0.8", "--top_k=65"], "error: --top_k=65: must be an integer in [0, 64]"),
    (
      ["--tokens=" + ",".join(["5"] * 17)],
      "error: prompt 1 has 17 tokens, more than model.T=16, the context this "
      "RoPE model was trained on; shorten it, or keep its last 16 tokens "
      "(--truncate_prompts)",
    ),
  ],
  ids=["negative-temperature", "top-k-past-the-vocabulary", "prompt-past-the-context"],
)
def test_generate_refuses_sampling_and_prompt_mistakes_by_flag(tiny_export, args, expected):
  before = snapshot(tiny_export)
  line = one_line_error(run_cli("generate", f"--workdir={tiny_export}", *args))
  assert line.startswith(expected)
  assert snapshot(tiny_export) == before


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> tuple[str, str]:
  """(run directory, data dir) of the tiny config with checkpoints at steps 6 and 12 of a random state."""
  workdir, data_dir = str(tmp_path_factory.mktemp("saved") / "run"), str(tmp_path_factory.mktemp("data"))
  cfg = base.override(base.get_config("all_taper"), {**TINY, "data.data_dir": data_dir})
  abstract = Trainer(cfg, sharding.make_mesh()).abstract_state()
  rng = np.random.default_rng(0)
  state = jax.tree.map(lambda s: jax.device_put(rng.normal(size=s.shape).astype(s.dtype), s.sharding), abstract)
  rundir = RunDir(workdir)
  os.makedirs(rundir.path)
  rundir.write_config(cfg)
  ckpt = Checkpointer(rundir.file("checkpoints"))
  for step in (6, 12):
    ckpt.save(step, state, {"position": step})
  ckpt.close()
  return workdir, data_dir


def damage(workdir: str, how: str) -> str:
  """Truncates, or deletes, the largest data file inside the latest checkpoint (step 12); returns its path."""
  d = os.path.join(workdir, "checkpoints", "12", "state", "ocdbt.process_0", "d")
  path = max((os.path.join(d, name) for name in os.listdir(d)), key=os.path.getsize)
  if how == "truncated":
    os.truncate(path, os.path.getsize(path) // 2)
  else:
    os.remove(path)
  return path


@pytest.mark.parametrize("how", ["truncated", "deleted"])
def test_a_damaged_latest_checkpoint_is_named_with_the_fallback_and_nothing_changes(saved_run, tmp_path, how):
  workdir = str(tmp_path / "run")
  shutil.copytree(saved_run[0], workdir)
  damage(workdir, how)
  before = snapshot(workdir)
  line = one_line_error(run_cli("tinystories", f"--workdir={workdir}", *tiny_flags(saved_run[1])))
  assert line.startswith(f"error: the checkpoint at step 12 in {workdir}/checkpoints is damaged: ")
  assert line.endswith(
    "The newest other checkpoint is step 6: to resume from it, re-run with "
    "--config.checkpoint.on_damaged=fallback (step 12 is then moved aside to 12.damaged-<time>, "
    "not deleted)."
  )
  assert len(line) < 600 and "tensorstore_spec" not in line
  assert snapshot(workdir) == before


def test_the_fallback_resumes_from_the_newest_good_checkpoint_and_keeps_the_damaged_one(saved_run, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(saved_run[0], workdir)
  damage(workdir, "truncated")
  files_before = len(snapshot(workdir))
  cfg = base.override(base.get_config("all_taper"), {**TINY, "data.data_dir": saved_run[1]})
  target = Trainer(cfg, sharding.make_mesh()).abstract_state()
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  with pytest.raises(DamagedCheckpointError, match="step 12 .* is damaged: .*newest other checkpoint is step 6"):
    ckpt.restore_latest(target)
  restored = ckpt.restore_latest(target, fallback=True)
  assert restored.step == 6 and restored.data_state == {"position": 6}
  [(step, reason, moved)] = restored.moved
  assert step == 12 and reason and os.path.basename(moved).startswith("12.damaged-") and os.path.isdir(moved)
  assert ckpt.all_steps() == [6] and len(snapshot(workdir)) == files_before  # renamed, nothing deleted
  ckpt.save(12, restored.state, restored.data_state)  # a new step 12 does not collide with the damaged one
  ckpt.wait()
  assert ckpt.all_steps() == [6, 12] and os.path.isdir(moved)
  ckpt.close()


def test_when_no_checkpoint_restores_nothing_is_moved(saved_run, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(saved_run[0], workdir)
  os.remove(os.path.join(workdir, "checkpoints", "12", "state", "_METADATA"))
  os.remove(os.path.join(workdir, "checkpoints", "6", "data", "metadata"))
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  with pytest.raises(
    DamagedCheckpointError,
    match=r"no checkpoint .* can be restored \(steps 12, 6; step 12: "
    r"state/_METADATA is missing\); nothing was moved",
  ):
    ckpt.restore_latest({"step": jax.ShapeDtypeStruct((), jnp.int32, sharding=None)}, fallback=True)
  assert ckpt.all_steps() == [6, 12]
  ckpt.close()


def test_user_errors_exit_2_bugs_keep_their_traceback_and_a_nan_stop_exits_1(capsys):
  def fails(error):
    def main(argv):
      raise error

    return cli.guard(main)

  with pytest.raises(SystemExit) as stop:
    fails(FloatingPointError("loss is nan at step 3; stopping"))(["prog"])
  assert stop.value.code == 1 and capsys.readouterr().err == "error: loss is nan at step 3; stopping\n"
  with pytest.raises(SystemExit) as stop:
    fails(FileNotFoundError("runs/x/config.json not found"))(["prog"])
  assert stop.value.code == 2
  JaxRuntimeError = type("JaxRuntimeError", (RuntimeError,), {})  # XLA's, matched by name
  with pytest.raises(SystemExit) as stop:
    fails(JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 123 bytes."))(["prog"])
  assert stop.value.code == 1 and "error: out of device memory (RESOURCE_EXHAUSTED" in capsys.readouterr().err
  with pytest.raises(KeyError):  # a bug
    fails(KeyError("params"))(["prog"])
  try:
    np.zeros(3).reshape(2)  # a ValueError raised by a library, not by this project: a bug, with its traceback
  except ValueError as e:
    library_error = e
  assert cli.exit_code(library_error) is None
  with pytest.raises(ValueError):
    fails(library_error)(["prog"])


def test_two_overrides_of_one_shared_field_are_refused_by_override():
  with pytest.raises(ValueError, match=r"model\.T=64 and data\.seq_len=32: these fields are one shared value"):
    base.override(base.get_config("all_taper"), {"model.T": 64, "data.seq_len": 32})
  with pytest.raises(ValueError, match=r"'train\.stepz' does not exist .*did you mean 'train\.steps'"):
    base.override(base.get_config("all_taper"), {"train.stepz": 1})
  cfg = base.override(base.get_config("all_taper"), {"model.T": 64, "data.seq_len": 64})
  assert cfg.model.T == cfg.data.seq_len == 64


def _llama(**changes) -> tuple[dict, ModelConfig]:
  cfg = ModelConfig(**{**dict(family="llama", V=32, D=16, H=2, L=1, T=8), **changes})
  return init(cfg, jax.random.key(0)), cfg


def test_sampling_parameters_outside_their_domain_are_named():
  logits_BxV, key = jnp.zeros((2, 32)), jax.random.key(0)
  with pytest.raises(ValueError, match=r"temperature=-1\.0: must be a finite number >= 0"):
    decode.sample(logits_BxV, key, temperature=-1.0)
  with pytest.raises(ValueError, match=r"top_k=33: must be an integer in \[0, 32\]"):
    decode.sample(logits_BxV, key, temperature=1.0, top_k=33)
  with pytest.raises(ValueError, match=r"top_k=-1"):
    decode.sample(logits_BxV, key, temperature=1.0, top_k=-1)
  variables, cfg = _llama()
  prompt_BxP, lengths_B = decode.pad_prompts([[1, 2]])
  with pytest.raises(ValueError, match=r"max_new_tokens=0: must be an integer >= 1"):
    decode.generate(variables, cfg, prompt_BxP, lengths_B, key, max_new_tokens=0)
  with pytest.raises(ValueError, match=r"temperature=nan"):
    decode.generate(variables, cfg, prompt_BxP, lengths_B, key, max_new_tokens=2, temperature=float("nan"))


def test_the_cache_refuses_writes_past_its_end_and_gpt2_past_its_positions():
  variables, cfg = _llama()
  cache = decode.init_cache(cfg, 1, 4)
  tokens_B = jnp.asarray([1], jnp.int32)
  past_the_end = r"index_B=\[4\]: writing 1 token\(s\) from slot 4 runs past the cache's 4 slots"
  with pytest.raises(ValueError, match=past_the_end):
    decode.decode_step(variables, cfg, tokens_B, jnp.asarray([4], jnp.int32), cache)
  with pytest.raises(ValueError, match=r"tokens_BxQ has 5 tokens per row but the cache has only 4 slots"):  # traced
    jax.jit(lambda p, n: decode.prefill(variables, cfg, p, n, cache))(
      jnp.ones((1, 5), jnp.int32), jnp.asarray([5], jnp.int32)
    )
  gpt2_vars, gpt2 = _llama(family="gpt2")
  with pytest.raises(ValueError, match=r"the cache has 9 slots but a gpt2 model has model\.T=8 learned positions"):
    decode.decode_step(gpt2_vars, gpt2, tokens_B, jnp.asarray([0], jnp.int32), decode.init_cache(gpt2, 1, 9))
  with pytest.raises(
    ValueError,
    match=r"max_new_tokens=4: a prompt of 6 tokens \+ max_new_tokens − 1 = 9 exceeds "
    r"model\.T=8",
  ):
    decode.generate(gpt2_vars, gpt2, *decode.pad_prompts([[1] * 6]), jax.random.key(0), max_new_tokens=4)
  with pytest.raises(ValueError, match=r"gate=\[1\.5\]: must lie in \[0, 1\]"):
    Transformer(cfg).apply(variables, jnp.ones((1, 3), jnp.int32), gate=[1.5])


def test_an_llama_request_past_its_context_is_served_with_one_warning(caplog):
  variables, cfg = _llama(T=4)
  prompt_BxP, lengths_B = decode.pad_prompts([[1, 2, 3]])
  with caplog.at_level(logging.WARNING, logger="tapernorm_jax.inference.decode"):
    decode.generate(variables, cfg, prompt_BxP, lengths_B, jax.random.key(0), max_new_tokens=3)
    decode.generate(variables, cfg, prompt_BxP, lengths_B, jax.random.key(1), max_new_tokens=3)  # compiled: silent
  [record] = caplog.records
  assert "positions 0…4 (a prompt of 3 tokens + 3 new), past the model.T=4 positions" in record.getMessage()


def test_prompts_past_the_context_are_refused_or_cut_with_counts():
  _, cfg = _llama()
  with pytest.raises(
    ValueError,
    match=r"prompt 2 has 10 tokens, more than model\.T=8, the context this RoPE model "
    r"was trained on \(2 prompts are too long\)",
  ):
    prompts.fit_prompts([[1], [2] * 10, [3] * 9], cfg, max_new_tokens=4)
  cut, note = prompts.fit_prompts([[1], [2] * 10, [3] * 9], cfg, max_new_tokens=4, truncate=True)
  assert cut == [[1], [2] * 8, [3] * 8]
  assert note.startswith("cut 2 of 3 prompt(s) to their last 8 tokens") and "dropping 3 token(s)" in note
  gpt2 = cfg.replace(family="gpt2")
  assert prompts.fit_prompts([[1] * 6], gpt2, max_new_tokens=4, truncate=True)[0] == [[1] * 5]
  with pytest.raises(ValueError, match=r"'1,x': 'x' is not a token id"):
    prompts.parse_token_ids("1,x", 32)
  with pytest.raises(ValueError, match=r"token id 32 is outside the vocabulary \[0, 32\)"):
    prompts.parse_token_ids("1,32", 32)


def test_invalid_utf8_is_replaced_and_warned_about_once_per_file_with_the_count(tmp_path, caplog):
  path = tmp_path / "bad.txt"
  path.write_bytes(b"fine\n<|endoftext|>\nbroken \xff\xfe and \xe2\x82 end")
  with caplog.at_level(logging.WARNING, logger="tapernorm_jax.data.text_files"):
    first = list(text_files.read_documents([path], "<|endoftext|>"))
    assert list(text_files.read_documents([path], "<|endoftext|>")) == first  # read again: no second warning
  assert first == ["fine", "broken \ufffd\ufffd and \ufffd\ufffd end"]
  [record] = caplog.records
  assert f"{path}: 4 byte(s) are not valid UTF-8; each was replaced by U+FFFD" in record.getMessage()


def test_documents_too_long_for_tokenizer_training_are_counted(monkeypatch, caplog):
  monkeypatch.setattr(sentencepiece, "MAX_SENTENCE_BYTES", 300)
  docs = [story[:250] for story in stories.generate(100)] + ["x" * 400, "y" * 500]
  with caplog.at_level(logging.WARNING, logger="tapernorm_jax.tokenizers.sentencepiece"):
    sentencepiece.train(docs, sentencepiece.TokenizerSettings(vocab_size=400), "tiny corpus")
  [record] = caplog.records
  assert "tiny corpus: 2 document(s) longer than 300 bytes (the longest 500) were left out" in record.getMessage()


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is not None, reason="lm-eval is installed here")
def test_the_harness_without_lm_eval_says_so_in_one_line():
  out = subprocess.run(
    [sys.executable, "-m", "tapernorm_jax.harness", "--tasks", "lambada"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert (
    out.returncode == 2
    and out.stdout == ""
    and out.stderr.strip().splitlines()
    == [
      "error: python -m tapernorm_jax.harness needs lm-eval: lm_eval is not installed; "
      "pip install 'tapernorm-jax[eval]'"
    ]
  )


@pytest.mark.parametrize("where", ["missing", "not_a_clone"])
def test_an_accelerator_check_checkout_that_is_not_a_clone_is_named(tmp_path, where):
  directory = tmp_path / where
  if where == "not_a_clone":
    directory.mkdir()
  line = one_line_error(run_cli("accelerator_check", f"--checkout={directory}", f"--out={tmp_path / 'out'}"))
  assert (
    line.startswith(f"error: --checkout={directory}: ")
    and ("does not exist" if where == "missing" else "is not a clone") in line
  )
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
  "flag, fragment",
  [
    ("--decode_batch=-1", "--decode_batch=-1: must be >= 0"),
    ("--prompt_len=-2", "--prompt_len=-2: must be >= 0"),
    (
      "--prompt_len=32",
      "--prompt_len=32: the KV cache holds model.T = 32 positions and the decode step needs one "
      "after the prompt; use at most 31",
    ),
    ("--suggest_limit=-3", "--suggest_limit=-3: must be >= 0"),
  ],
)
def test_compile_check_flags_out_of_range_are_one_line_before_compiling(tmp_path, flag, fragment):
  line = one_line_error(
    run_cli(
      "compile_check",
      "--topology=v5e:2x2",
      "--config=configs/all_taper.py:size=cpu",
      "--config.model.T=32",
      flag,
      f"--out={tmp_path / 'out'}",
    )
  )
  assert line.startswith(f"error: {fragment}") and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
  "override, fragment",
  [
    ("--config.taper.mu=5", "error: taper.mu=5.0: the EMA weight μ must lie in (0, 1]"),
    ("--config.taper.taper_end=99999", "error: taper.taper_end=99999: must be -1 (the last step) or in (0, "),
    ("--config.train.batch_size=12", "error: train.batch_size=12: must be divisible by the data-parallel size (8"),
    ("--config.data.tune_frac=0.6", "error: data.tune_frac=0.6: must lie in [0, 0.5) (the share of the train stream"),
  ],
)
def test_check_only_checks_the_values_a_run_would_refuse(tmp_path, override, fragment):
  args = ["--config=configs/all_taper.py:size=cpu", override, f"--workdir={tmp_path / 'run'}", "--check_only"]
  if "batch_size" in override:  # the split over devices is checked where the mesh says how many
    args.append("--config.mesh.data=8")
  line = one_line_error(run_cli("tinystories", *args))
  assert line.startswith(fragment) and not (tmp_path / "run").exists()


def test_a_method_setting_the_variant_does_not_read_is_one_warning_line(tmp_path):
  done = run_cli(
    "tinystories",
    "--config=configs/all_taper.py:size=cpu",
    "--config.fakeln.start=50",
    f"--workdir={tmp_path / 'run'}",
    "--check_only",
  )
  assert done.returncode == 0, done.stderr[-2000:]
  warned = [line for line in done.stderr.splitlines() if "does nothing" in line]
  assert len(warned) == 1 and warned[0] == (  # the whole line: no absl prefix (time, thread id, source line)
    "warning: fakeln.start=50 does nothing for variant 'all_taper': it trains with method='taper', which reads no "
    "fakeln.* field (drop it, or choose the fakeln variant)"
  )


@pytest.mark.parametrize(
  "line, fragment",
  [
    ("c.fakeln.mu = None", "error: fakeln.mu=None: must be a float, as its default 0.01 is"),
    (
      "c.taper.calibration_step = 150",
      "error: taper.calibration_step: config.taper has no field "
      "'calibration_step'; no run reads it; did you mean "
      "taper.min_calibration_step?",
    ),
    (
      "c.fakeln.gap_atn = 4",
      "error: fakeln.gap_atn: config.fakeln has no field 'gap_atn'; no run reads it; did you mean fakeln.gap_attn?",
    ),
    ("c.fakeln.aux_weight = 0.2", "error: fakeln.aux_weight: this field is now fakeln.scale_loss_weight; set that one"),
  ],
)
def test_a_config_file_s_field_of_the_wrong_type_or_name_is_one_line(tmp_path, line, fragment):
  config = tmp_path / "mine.py"  # a user's own config file, built on a shipped one (ConfigDicts take None and new
  config.write_text(
    f"from configs import fakeln\n\ndef get_config():\n  c = fakeln.get_config('size=cpu')\n  {line}\n  return c\n"
  )  # fields without a word: the check is ours)
  result = run_cli("tinystories", f"--config={config}", f"--workdir={tmp_path / 'run'}", "--check_only")
  assert one_line_error(result) == fragment and not (tmp_path / "run").exists()


def test_a_calibration_before_the_residual_stream_settles_is_one_warning_line(tmp_path):
  done = run_cli(
    "tinystories",
    "--config=configs/all_taper.py:size=1m",
    "--config.train.steps=40",
    f"--workdir={tmp_path / 'run'}",
    "--check_only",
  )
  assert done.returncode == 0, done.stderr[-2000:]
  warned = [line for line in done.stderr.splitlines() if "calibration at step" in line]
  assert len(warned) == 1 and warned[0].startswith(  # round(0.05 · 40) = 2: the 40-step run that diverged
    "warning: calibration at step 2 of 40 (taper.gate_warmup_frac=0.05; taper.min_calibration_step=100 applies "
    "only up to half the run), early in training: calibrations this early"
  )
  paper = run_cli(
    "tinystories", "--config=configs/all_taper.py:size=1m", f"--workdir={tmp_path / 'run'}", "--check_only"
  )  # step 25,000 of the paper's 500,000
  assert paper.returncode == 0 and "calibration at step" not in paper.stderr
  floored = run_cli(
    "tinystories", "--config=configs/all_taper.py:size=cpu", f"--workdir={tmp_path / 'run'}", "--check_only"
  )  # 300 steps: 5% is step 15, the floor moves it to step 100
  assert floored.returncode == 0 and "calibration at step" not in floored.stderr
  for frac, warns in ((0.15, True), (0.2, False)):  # step 45 warns; step 60, the tuning study's choice, does not
    early = run_cli(
      "tinystories",
      "--config=configs/all_taper.py:size=cpu,tuned=0",
      "--config.taper.min_calibration_step=0",
      f"--config.taper.gate_warmup_frac={frac}",
      f"--workdir={tmp_path / 'run'}",
      "--check_only",
    )
    assert early.returncode == 0 and ("calibration at step" in early.stderr) == warns, early.stderr[-2000:]


@pytest.mark.parametrize(
  "flag, fragment",
  [
    ("--studies=0", "--studies=0: must be >= 1"),
    ("--resamples=5", "--resamples=5: must be >= 20"),
    ("--noise=1.5", "--noise=1.5: must lie in (0, 1)"),
  ],
)
def test_fit_coverage_flags_out_of_range_are_one_line(tmp_path, flag, fragment):
  line = one_line_error(run_cli("fit_coverage", flag, f"--out={tmp_path / 'c.json'}"))
  assert line.startswith(f"error: {fragment}") and not (tmp_path / "c.json").exists()


def test_fit_coverage_writes_what_it_prints(tmp_path):
  done = run_cli("fit_coverage", "--studies=4", "--resamples=20", f"--out={tmp_path / 'c.json'}")
  assert done.returncode == 0, done.stderr[-2000:]
  written = json.loads((tmp_path / "c.json").read_text())
  assert written["setting"]["studies"] == 4 and written["rates"]["b"]["n"] == 4
  assert f"| b | {100 * written['rates']['b']['rate']:.1f}% ± " in done.stdout
