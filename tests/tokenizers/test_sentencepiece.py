"""The SentencePiece tokenizer: lossless round trip, determinism, saved settings and clear errors."""

import json

import pytest

from tapernorm_jax.data import stories
from tapernorm_jax.tokenizers import sentencepiece as tokenizer_lib

SETTINGS = tokenizer_lib.TokenizerSettings(vocab_size=500)


@pytest.fixture(scope="module")
def docs() -> list[str]:
  return list(stories.generate(300, seed=0))


@pytest.fixture(scope="module")
def tok(docs) -> tokenizer_lib.Tokenizer:
  return tokenizer_lib.train(docs, SETTINGS)


def test_round_trip_is_lossless(tok, docs):
  texts = [*docs[:5], "Line one.\n\nLine  two,\ttabbed.", "Curly “quotes”, é, 日本, 😀 and \x00 bytes", " spaced "]
  for text in texts:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
  assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_special_ids_and_size(tok):
  assert tok.vocab_size == 500
  assert (tok.bos_id, tok.eos_id) == (1, 2)
  assert tok.decode([tok.bos_id, *tok.encode("Hi."), tok.eos_id]) == "Hi."


def test_training_is_deterministic(tok, docs):
  assert tokenizer_lib.train(docs, SETTINGS).model_proto == tok.model_proto


def test_unigram_also_trains_and_round_trips(docs):
  unigram = tokenizer_lib.train(docs, tokenizer_lib.TokenizerSettings(vocab_size=500, model_type="unigram"))
  assert unigram.vocab_size == 500 and unigram.decode(unigram.encode(docs[0] + " 😀")) == docs[0] + " 😀"


def test_save_load_and_settings_mismatch(tok, tmp_path):
  tok.save(tmp_path)
  assert tokenizer_lib.load(tmp_path, SETTINGS).encode("A cat.") == tok.encode("A cat.")
  with pytest.raises(tokenizer_lib.TokenizerMismatchError, match="vocab_size: cached 500 vs requested 600"):
    tokenizer_lib.load(tmp_path, tokenizer_lib.TokenizerSettings(vocab_size=600))
  (tmp_path / tokenizer_lib.SETTINGS_FILE).write_text(json.dumps(SETTINGS.to_dict() | {"model_type": "unigram"}))
  with pytest.raises(tokenizer_lib.TokenizerMismatchError, match="model_type"):
    tokenizer_lib.load(tmp_path, SETTINGS)
  tok.save(tmp_path)
  smaller = tokenizer_lib.train(stories.generate(100), tokenizer_lib.TokenizerSettings(vocab_size=400))
  (tmp_path / tokenizer_lib.MODEL_FILE).write_bytes(smaller.model_proto)  # settings say 500, the model has 400
  with pytest.raises(tokenizer_lib.TokenizerMismatchError, match="has 400 pieces, not 500"):
    tokenizer_lib.load(tmp_path, SETTINGS)
  with pytest.raises(FileNotFoundError, match="no tokenizer"):
    tokenizer_lib.load(tmp_path / "missing", SETTINGS)


def test_too_small_corpus_and_no_text_are_clear_errors(docs):
  with pytest.raises(ValueError, match="too small for a 5000-piece tokenizer.*at most"):
    tokenizer_lib.train(docs[:3], tokenizer_lib.TokenizerSettings(vocab_size=5000), "tiny corpus")
  with pytest.raises(ValueError, match="no training text"):
    tokenizer_lib.train([], SETTINGS)
  alphabet = "".join(chr(0x4E00 + i) for i in range(200))  # 200 distinct characters, equally frequent
  with pytest.raises(
    ValueError,
    match=r"has (\d+) distinct characters .* than a 64-piece tokenizer holds; raise "
    r"data.vocab_size \(and model.V\) to at least \1$",
  ) as e:
    tokenizer_lib.train([alphabet] * 3, tokenizer_lib.TokenizerSettings(vocab_size=64), "wide corpus")
  assert int(str(e.value).split(" has ")[1].split()[0]) >= 200


def test_train_bytes_budget_takes_whole_documents():
  assert list(tokenizer_lib.take_bytes(["aaaa", "bb", "c"], 6)) == ["aaaa", "bb"]
  assert list(tokenizer_lib.take_bytes(["aaaaaaaa", "b"], 3)) == ["aaaaaaaa"]
