"""`data.prepare`: cached token streams keyed by settings, atomic builds, corpus names and clear errors."""

import json
import os

import numpy as np
import pytest

from configs import base
from tapernorm_jax import data
from tapernorm_jax.data import corpora, stories
from tapernorm_jax.data import prepared as prepared_lib
from tapernorm_jax.tokenizers import sentencepiece as tokenizer_lib


def small(tmp_path, **overrides) -> dict:
  """A small synthetic-corpus `cfg.data`."""
  return (
    dict(
      source="synthetic",
      data_dir=str(tmp_path),
      synthetic_train_stories=300,
      synthetic_valid_stories=30,
      synthetic_seed=0,
      vocab_size=500,
      seq_len=64,
    )
    | overrides
  )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def prepared(cache_dir) -> data.Prepared:
  return data.prepare(small(cache_dir))


def test_name_vocab_and_counts(prepared):
  assert prepared.name == "synthetic-stories(seed=0,train=300,valid=30)"
  assert prepared.vocab_size == 500
  assert prepared.meta["splits"]["train"]["num_documents"] == 300
  assert prepared.num_tokens("train") > 20 * prepared.num_tokens("validation") / 2 > 0
  with pytest.raises(ValueError, match="split"):
    prepared.num_tokens("test")


def test_streams_are_bos_doc_eos_per_document(prepared):
  tokens = np.asarray(prepared.tokens("validation"))
  tok = prepared.tokenizer
  bos = np.flatnonzero(tokens == tok.bos_id)
  eos = np.flatnonzero(tokens == tok.eos_id)
  assert len(bos) == len(eos) == 30 and bos[0] == 0 and eos[-1] == len(tokens) - 1
  docs = list(stories.generate(30, seed=0, split="validation"))
  assert [tok.decode(tokens[b + 1 : e]) for b, e in zip(bos, eos)] == docs


def test_tune_frac_holds_out_the_train_streams_last_whole_documents(cache_dir, prepared):
  held = data.prepare(small(cache_dir, tune_frac=0.1))
  assert held.path == prepared.path  # the same cache: the split is a view of the train stream
  train, tune, whole = (np.asarray(a) for a in (held.tokens("train"), held.tokens("tune"), prepared.tokens("train")))
  np.testing.assert_array_equal(np.concatenate([train, tune]), whole)  # nothing lost, nothing read twice
  tok = prepared.tokenizer
  assert train[-1] == tok.eos_id and tune[0] == tok.bos_id  # cut between documents
  docs = list(stories.generate(300, seed=0, split="train"))  # the tune split is the corpus's last stories
  n_tune = int((tune == tok.bos_id).sum())
  assert tok.decode(tune[1 : np.flatnonzero(tune == tok.eos_id)[0]]) == docs[-n_tune]
  longest = np.diff(np.flatnonzero(whole == tok.bos_id)).max()  # the cut is the first document start past 90%
  assert 0 <= 0.1 * len(whole) - len(tune) < longest + 1
  np.testing.assert_array_equal(held.tokens("validation"), prepared.tokens("validation"))  # the reported split
  for frac in (-0.1, 0.5):
    with pytest.raises(ValueError, match=rf"data.tune_frac={frac}: must lie in \[0, 0.5\)"):
      data.prepare(small(cache_dir, tune_frac=frac))
  with pytest.raises(ValueError, match="data.tune_frac=1e-06: no whole document"):
    data.prepare(small(cache_dir, tune_frac=1e-6))


def test_second_prepare_loads_the_cache(cache_dir, prepared, monkeypatch):
  monkeypatch.setattr(prepared_lib, "build", lambda *a: pytest.fail("rebuilt a complete cache"))
  again = data.prepare(small(cache_dir))
  assert again.path == prepared.path
  np.testing.assert_array_equal(again.tokens("train"), prepared.tokens("train"))


def test_other_settings_other_cache(cache_dir, prepared):
  assert data.prepare(small(cache_dir, vocab_size=400)).path != prepared.path
  other_seed = data.prepare(small(cache_dir, synthetic_seed=1))
  assert other_seed.path != prepared.path and "seed=1" in other_seed.name


def test_config_dict_missing_optional_fields_uses_defaults(tmp_path):
  cfg = base.get_config("baseline").data
  cfg.data_dir = str(tmp_path)
  cfg.synthetic_train_stories, cfg.synthetic_valid_stories = 300, 30
  del cfg["text_train"], cfg["text_valid"], cfg["manual_dir"], cfg["synthetic_seed"]
  cfg.vocab_size = 500
  prepared = data.prepare(cfg)
  assert prepared.name == "synthetic-stories(seed=0,train=300,valid=30)"
  assert prepared.meta["tokenizer"]["model_type"] == corpora.DEFAULTS["tokenizer_model"]


def test_interrupted_build_leaves_nothing_complete(tmp_path, monkeypatch):
  calls = []

  def interrupted(*args):
    calls.append(args)
    if len(calls) == 2:  # the validation stream
      raise KeyboardInterrupt
    return real(*args)

  real = prepared_lib.write_stream
  monkeypatch.setattr(prepared_lib, "write_stream", interrupted)
  with pytest.raises(KeyboardInterrupt):
    data.prepare(small(tmp_path))
  assert not list((tmp_path / "prepared").iterdir())  # neither the final nor the temporary directory
  monkeypatch.setattr(prepared_lib, "write_stream", real)
  assert data.prepare(small(tmp_path)).num_tokens("validation") > 0


def test_directory_without_marker_is_rebuilt(tmp_path, caplog):
  cfg = small(tmp_path)
  path = data.prepare(cfg).path
  (path / prepared_lib.COMPLETE).unlink()
  (path / "train.bin").write_bytes(b"half")
  prepared = data.prepare(cfg)
  assert (path / prepared_lib.COMPLETE).exists() and prepared.num_tokens("train") > 1000
  assert "removing incomplete" in caplog.text


def test_cached_tokenizer_with_other_settings_is_a_clear_error(tmp_path):
  cfg = small(tmp_path)
  path = data.prepare(cfg).path
  settings_file = path / tokenizer_lib.SETTINGS_FILE
  settings_file.write_text(json.dumps(json.loads(settings_file.read_text()) | {"vocab_size": 400}))
  with pytest.raises(tokenizer_lib.TokenizerMismatchError, match="vocab_size: cached 400 vs requested 500"):
    data.prepare(cfg)


def test_truncated_stream_is_a_clear_error(tmp_path):
  cfg = small(tmp_path)
  path = data.prepare(cfg).path
  with open(path / "validation.bin", "r+b") as f:
    f.truncate(10)
  with pytest.raises(ValueError, match="delete .* to rebuild"):
    data.prepare(cfg)


def test_split_shorter_than_one_window_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="validation split .* fewer than one window of seq_len \\+ 1 = 20001"):
    data.prepare(small(tmp_path, seq_len=20_000))


def test_bad_config_values_are_clear_errors(tmp_path):
  with pytest.raises(ValueError, match="data.source must be one of"):
    data.prepare(small(tmp_path, source="wikipedia"))
  with pytest.raises(ValueError, match="vocab_size must be a positive integer"):
    data.prepare(small(tmp_path, vocab_size=None))
  with pytest.raises(ValueError, match="at least one validation story"):
    data.prepare(small(tmp_path, synthetic_valid_stories=0))
  with pytest.raises(ValueError, match="too small for a 50000-piece tokenizer"):
    data.prepare(small(tmp_path, vocab_size=50_000))
  with pytest.raises(ValueError, match="needs data.text_valid"):
    data.prepare(small(tmp_path, source="text", text_train=str(tmp_path / "x.txt")))


def test_text_source(tmp_path):
  (tmp_path / "train").mkdir()
  docs = list(stories.generate(300, seed=2))
  for i in range(3):
    (tmp_path / "train" / f"part{i}.txt").write_text(" ## ".join(docs[i::3]))
  (tmp_path / "valid.txt").write_bytes(" ## ".join(stories.generate(20, split="validation")).encode() + b" \xff ## x")
  cfg = small(
    tmp_path,
    source="text",
    text_train=str(tmp_path / "train" / "*.txt"),
    text_valid=str(tmp_path / "valid.txt"),
    text_separator="##",
  )
  prepared = data.prepare(cfg)
  assert prepared.name == f"text(train={tmp_path}/train/*.txt,valid={tmp_path}/valid.txt)"
  assert prepared.meta["splits"]["train"]["num_documents"] == 300
  assert prepared.meta["splits"]["validation"]["num_documents"] == 21
  assert "\ufffd" in prepared.tokenizer.decode(prepared.tokens("validation")[-12:])
  os.utime(tmp_path / "valid.txt", (1, 1))  # a changed file is a new corpus
  assert data.prepare(cfg).path != prepared.path


def test_cpu_preset_prepares(tmp_path):
  cfg = base.get_config("baseline", "size=cpu").data
  cfg.data_dir = str(tmp_path)
  prepared = data.prepare(cfg)
  assert prepared.vocab_size == cfg.vocab_size == 2000
  assert prepared.name == "synthetic-stories(seed=0,train=20000,valid=1000)"
