"""`data.tokenizer`: GPT-2's fixed BPE on a prepared corpus (EOT after every document), cache keys and clear errors."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from tapernorm_jax import data
from tapernorm_jax.data import corpora, stories, tokenizer_choice
from tapernorm_jax.data import prepared as prepared_lib
from tapernorm_jax.tokenizers import gpt2_bpe
from tapernorm_jax.tokenizers.sentencepiece import TokenizerMismatchError
from locations import SHARED_DATA

GPT2_DIR = SHARED_DATA / "gpt2"
needs_gpt2 = pytest.mark.skipif(not (GPT2_DIR / "vocab.json").is_file(), reason="../shared/data/gpt2 is not here")
SEP = "<|endoftext|>"


def write_corpus(directory: Path) -> tuple[list[str], list[str]]:
  """A small text corpus (train and valid files, documents split on `<|endoftext|>`); returns both doc lists."""
  directory.mkdir(parents=True, exist_ok=True)
  train = list(stories.generate(40, seed=3))
  valid = list(stories.generate(6, seed=3, split="validation"))
  (directory / "train.txt").write_text(f"\n{SEP}\n".join(train))
  (directory / "valid.txt").write_text(f"\n{SEP}\n".join(valid))
  return train, valid


def text_cfg(tmp_path: Path, **overrides) -> dict:
  """A `cfg.data` for the small text corpus, with GPT-2's tokenizer."""
  return (
    dict(
      source="text",
      data_dir=str(tmp_path / "cache"),
      text_train=str(tmp_path / "corpus" / "train.txt"),
      text_valid=str(tmp_path / "corpus" / "valid.txt"),
      tokenizer="gpt2",
      tokenizer_dir=str(GPT2_DIR),
      vocab_size=50257,
      seq_len=32,
    )
    | overrides
  )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str], list[str]]:
  root = tmp_path_factory.mktemp("gpt2")
  train, valid = write_corpus(root / "corpus")
  return root, train, valid


@pytest.fixture(scope="module")
def prepared(corpus) -> data.Prepared:
  return data.prepare(text_cfg(corpus[0]))


def test_defaults_are_sentencepiece_and_the_gpt2_hub_name():
  assert corpora.DEFAULTS["tokenizer"] == "sentencepiece" and corpora.DEFAULTS["tokenizer_dir"] == "gpt2"


@needs_gpt2
def test_streams_are_doc_then_eot_without_bos(prepared, corpus):
  _, train, valid = corpus
  tok = prepared.tokenizer
  assert (tok.kind, tok.vocab_size, tok.eos_id, tok.bos_id, prepared.vocab_size) == ("gpt2", 50257, 50256, 50256, 50257)
  for split, docs in (("train", train), ("validation", valid)):
    tokens = np.asarray(prepared.tokens(split))
    assert tokens.dtype == np.uint16
    eot = np.flatnonzero(tokens == tok.eos_id)
    assert len(eot) == len(docs) == prepared.meta["splits"][split]["num_documents"]
    assert eot[-1] == len(tokens) - 1 and tokens[0] != tok.eos_id  # EOT after every document, none before the first
    bounds = zip([-1, *eot[:-1]], eot)
    assert [tok.decode(tokens[a + 1 : b]) for a, b in bounds] == docs
    assert tokens[: eot[0]].tolist() == tok.encode(docs[0])
  assert prepared.meta["tokenizer"] == dict(kind="gpt2", files_sha256=gpt2_bpe.files_digest(GPT2_DIR))


@needs_gpt2
def test_prepared_directory_holds_the_tokenizer_files(prepared):
  for name in gpt2_bpe.FILES:
    assert (prepared.path / name).read_bytes() == (GPT2_DIR / name).read_bytes()
  alone = gpt2_bpe.GPT2BPE(prepared.path)  # loads from the prepared directory on its own
  assert alone.encode("Hello world") == [15496, 995] and alone.fingerprint == prepared.tokenizer.fingerprint
  assert "gpt2" in prepared.path.name


@needs_gpt2
def test_cache_key_has_the_tokenizer_choice_and_file_content(prepared, corpus, tmp_path, monkeypatch):
  root = corpus[0]
  monkeypatch.setattr(prepared_lib, "build", lambda *a: pytest.fail("rebuilt a complete cache"))
  assert data.prepare(text_cfg(root)).path == prepared.path
  monkeypatch.undo()
  sentencepiece = data.prepare(text_cfg(root, tokenizer="sentencepiece", vocab_size=500))
  assert sentencepiece.path != prepared.path and sentencepiece.tokenizer.kind == "sentencepiece"
  first = np.asarray(sentencepiece.tokens("validation"))
  assert first[0] == sentencepiece.tokenizer.bos_id  # SentencePiece framing is unchanged: [bos, *ids, eos]
  other = tmp_path / "other_gpt2"
  shutil.copytree(GPT2_DIR, other)
  merges = (other / "merges.txt").read_text().splitlines(keepends=True)
  (other / "merges.txt").chmod(0o644)
  (other / "merges.txt").write_text("".join(merges[:-1]))  # other file content: a new cache
  assert data.prepare(text_cfg(root, tokenizer_dir=str(other))).path != prepared.path


@needs_gpt2
def test_vocab_size_mismatch_names_both_fields(corpus):
  with pytest.raises(ValueError, match=r"data.vocab_size=10000 does not match data.tokenizer='gpt2' .* has 50257 ids"):
    data.prepare(text_cfg(corpus[0], vocab_size=10_000))


@needs_gpt2
def test_changed_tokenizer_files_in_the_cache_are_a_clear_error(corpus, tmp_path):
  cfg = text_cfg(corpus[0], data_dir=str(tmp_path / "cache"))
  path = data.prepare(cfg).path
  (path / "merges.txt").write_text("".join((GPT2_DIR / "merges.txt").read_text().splitlines(keepends=True)[:-1]))
  with pytest.raises(TokenizerMismatchError, match="differ from those of data.tokenizer_dir"):
    data.prepare(cfg)


def test_bad_tokenizer_fields_are_clear_errors(tmp_path):
  base = dict(
    source="synthetic", data_dir=str(tmp_path), synthetic_train_stories=50, synthetic_valid_stories=5, vocab_size=300
  )
  with pytest.raises(ValueError, match=r"data.tokenizer must be one of \('sentencepiece', 'gpt2'\), got 'bpe'"):
    data.prepare(base | dict(tokenizer="bpe"))
  with pytest.raises(ValueError, match="needs data.tokenizer_dir"):
    tokenizer_choice.from_config(base | dict(tokenizer="gpt2", tokenizer_dir=""), 50257)
  with pytest.raises(FileNotFoundError, match="has no vocab.json, merges.txt.*config.data.tokenizer_dir=DIR"):
    data.prepare(base | dict(tokenizer="gpt2", tokenizer_dir=str(tmp_path), vocab_size=50257))
