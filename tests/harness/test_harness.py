"""The `tapernorm` model type of lm-evaluation-harness (tapernorm_jax/harness), on local tasks committed beside this
file: the harness's log-likelihoods equal the model's own forward computed here, token by token; the folded and
unfolded forms agree; generation is the greedy continuation cut at the task's stop sequences; a GPT-2 (BPE) export
works as a TinyStories (SentencePiece) run does. Runs where the `eval` extra is installed (CI's extras leg)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from locations import SHARED_DATA
from tapernorm_jax.inference import export, loading
from tapernorm_jax.model import ModelConfig, Transformer, init
from tapernorm_jax.train import loop, run_config

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.tasks import TaskManager  # noqa: E402

from tapernorm_jax.harness import TaperNormLM  # noqa: E402

HERE = Path(__file__).parent
TASKS = ["tapernorm_tiny_choice", "tapernorm_tiny_rolling", "tapernorm_tiny_until"]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
  """Hugging Face libraries never reach a network (the tasks read their documents from beside this file)."""
  for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    monkeypatch.setenv(name, "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> str:
  """A tiny all_taper run on the synthetic corpus (SentencePiece), trained past its taper so the gate is 0."""
  root = tmp_path_factory.mktemp("harness")
  cfg = run_config.override(
    run_config.get_config("all_taper", "size=cpu"),
    {
      "model.D": 32,
      "model.H": 4,
      "model.L": 1,
      "model.T": 64,
      "model.V": 512,
      "train.steps": 8,
      "train.batch_size": 8,
      "train.eval_batches": 1,
      "checkpoint.every": 4,
      "taper.gate_warmup_frac": 0.25,
      "data.data_dir": str(root / "data"),
      "data.synthetic_train_stories": 200,
      "data.synthetic_valid_stories": 30,
    },
  )
  loop.run(cfg, str(root / "run"), devices=jax.devices()[:4])
  return str(root / "run")


def evaluate(lm: TaperNormLM, tasks: list[str]) -> dict:
  """The harness on the local tasks, with every request's response kept."""
  return lm_eval.simple_evaluate(
    model=lm, tasks=tasks, task_manager=TaskManager(include_path=str(HERE)), log_samples=True, verbosity="WARNING"
  )


def log_likelihoods(sample: dict) -> list[float]:
  """The log-likelihood of each request of a logged sample (a (value, greedy) pair, or a value alone)."""
  return [float(r[0][0] if isinstance(r[0], (list, tuple)) else r[0]) for r in sample["resps"]]


def direct_log_probs(path: str, tokens: list[int]) -> np.ndarray:
  """log p(tokens[i] | tokens[:i]) for i ≥ 1 from one unpadded forward of the unfolded model at g = 0."""
  loaded = loading.load(path)
  logits_1xTxV = Transformer(loaded.model_cfg).apply(loaded.variables, np.asarray([tokens[:-1]], np.int32), 0.0)
  log_probs_TxV = np.asarray(jax.nn.log_softmax(logits_1xTxV[0].astype(np.float32), axis=-1))
  return log_probs_TxV[np.arange(len(tokens) - 1), tokens[1:]]


def continuation_log_prob(lm: TaperNormLM, path: str, context: str, continuation: str) -> float:
  """The harness's split of context and continuation into tokens, scored by `direct_log_probs`."""
  whole, head = lm.tok_encode(context + continuation), lm.tok_encode(context)
  return float(direct_log_probs(path, whole)[len(head) - 1 :].sum())


def test_log_likelihoods_equal_the_models_own_forward_and_the_forms_agree(run_dir):
  folded = evaluate(TaperNormLM(run_dir, form="folded", batch_size=3), TASKS[:2])
  unfolded = evaluate(TaperNormLM(run_dir, form="unfolded", batch_size=2), TASKS[:2])
  lm = TaperNormLM(run_dir)
  for sample in folded["samples"]["tapernorm_tiny_choice"]:
    doc = sample["doc"]
    expected = [continuation_log_prob(lm, run_dir, doc["context"], c) for c in doc["choices"]]
    assert log_likelihoods(sample) == pytest.approx(expected, abs=2e-4)
  for sample in folded["samples"]["tapernorm_tiny_rolling"]:  # each text after the beginning-of-text token
    tokens = [lm.prefix_token_id, *lm.tok_encode(sample["doc"]["text"])]
    assert log_likelihoods(sample) == pytest.approx([float(direct_log_probs(run_dir, tokens).sum())], abs=5e-4)
  for task in TASKS[:2]:  # the fold changes the arithmetic, not the model
    pairs = zip(folded["samples"][task], unfolded["samples"][task])
    for a, b in pairs:
      assert log_likelihoods(a) == pytest.approx(log_likelihoods(b), abs=1e-3)
  assert folded["results"]["tapernorm_tiny_choice"]["acc,none"] == pytest.approx(
    unfolded["results"]["tapernorm_tiny_choice"]["acc,none"]
  )


def test_generation_is_the_greedy_continuation_cut_at_the_stop_sequences(run_dir):
  lm = TaperNormLM(run_dir, batch_size=3)
  samples = evaluate(lm, TASKS[2:])["samples"]["tapernorm_tiny_until"]
  loaded = loading.load(run_dir)
  forward = jax.jit(lambda tokens_1xT: Transformer(loaded.model_cfg).apply(loaded.variables, tokens_1xT, 0.0))
  for sample in samples:
    tokens = [lm.prefix_token_id, *lm.tok_encode(sample["doc"]["context"])]
    new = []
    for _ in range(12):  # greedy by full forwards, no cache: a second path to the same tokens (causal: the zeros
      padded_1xT = np.zeros((1, loaded.model_cfg.T), np.int32)  # after the sequence change nothing before them)
      padded_1xT[0, : len(tokens) + len(new)] = tokens + new
      new.append(int(np.argmax(forward(padded_1xT)[0, len(tokens) + len(new) - 1])))
      if new[-1] == lm.eot_token_id:
        break
    text = lm.tok_decode(new)
    cut = min((text[: text.index(s)] for s in (".", "\n") if s in text), key=len, default=text)
    assert sample["resps"][0][0] == cut and "." not in cut and "\n" not in cut


@pytest.mark.skipif(not (SHARED_DATA / "gpt2").is_dir(), reason="needs ../shared/data/gpt2 (GPT-2's tokenizer files)")
def test_a_gpt2_export_with_its_bpe_tokenizer_is_scored_the_same_way(tmp_path):
  from tapernorm_jax.tokenizers.gpt2_bpe import GPT2Tokenizer

  cfg = ModelConfig(family="gpt2", V=50_257, D=32, H=4, L=1, T=64, internal_norm="taper", final_norm="taper")
  path = str(tmp_path / "export")
  export.save(path, init(cfg, jax.random.key(0)), cfg, tokenizer=GPT2Tokenizer(SHARED_DATA / "gpt2"))
  lm = TaperNormLM(path, batch_size=4)
  for sample in evaluate(lm, TASKS[:1])["samples"]["tapernorm_tiny_choice"]:
    doc = sample["doc"]
    expected = [continuation_log_prob(lm, path, doc["context"], c) for c in doc["choices"]]
    assert log_likelihoods(sample) == pytest.approx(expected, abs=2e-4)


def test_the_command_line_is_lm_evals_own_with_the_model_registered(run_dir, tmp_path):
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "tapernorm_jax.harness",
      "--model",
      "tapernorm",
      "--model_args",
      f"path={run_dir},form=folded",
      "--tasks",
      TASKS[0],
      "--include_path",
      str(HERE),
      "--output_path",
      str(tmp_path / "out"),
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  (written,) = [
    os.path.join(d, f) for d, _, names in os.walk(tmp_path / "out") for f in names if f.startswith("results")
  ]
  with open(written) as f:
    acc = json.load(f)["results"][TASKS[0]]["acc,none"]
  assert acc == evaluate(TaperNormLM(run_dir), TASKS[:1])["results"][TASKS[0]]["acc,none"]


def test_bad_model_args_are_one_line(run_dir, tmp_path):
  with pytest.raises(ValueError, match=r"form='fold': choose folded or unfolded"):
    TaperNormLM(run_dir, form="fold")
  with pytest.raises(FileNotFoundError, match="must be a training run or an export directory"):
    TaperNormLM(str(tmp_path / "nothing"))
  assert os.path.isdir(run_dir)
