"""Named eval sets: parsing, token streams framed like training, caching by files and tokenizer, eval windows."""

import os
from pathlib import Path

import numpy as np
import pytest

from tapernorm_jax import data
from tapernorm_jax.data import evaluation_sets, stories

SEP = "<|endoftext|>"


def small(tmp_path: Path, **overrides) -> dict:
  """A small synthetic-corpus `cfg.data`."""
  return (
    dict(
      source="synthetic",
      data_dir=str(tmp_path / "cache"),
      synthetic_train_stories=300,
      synthetic_valid_stories=30,
      vocab_size=500,
      seq_len=32,
    )
    | overrides
  )


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
  root = tmp_path_factory.mktemp("eval_sets")
  (root / "books").mkdir()
  for k in range(2):
    (root / "books" / f"part{k}.txt").write_text(SEP.join(stories.generate(10, seed=10 + k)))
  (root / "news.txt").write_text(SEP.join(stories.generate(5, seed=20)))
  (root / "tiny.txt").write_text("Too short.")
  return root


@pytest.fixture(scope="module")
def prepared(root) -> data.Prepared:
  return data.prepare(small(root))


def framed(tokenizer, docs: list[str]) -> list[int]:
  """The stream the eval set should hold: every document framed as in training."""
  return [i for doc in docs for i in tokenizer.frame(tokenizer.encode(doc))]


def test_parse():
  assert evaluation_sets.parse("") == {}
  assert evaluation_sets.parse(" wiki = /d/w.txt , books=/d/b/*.txt,") == {"wiki": "/d/w.txt", "books": "/d/b/*.txt"}
  for bad, match in (
    ("wiki", "not name=path_or_glob"),
    ("=x.txt", "not name=path_or_glob"),
    ("a b=x.txt", "not name=path_or_glob"),
    ("val=x.txt", "reserved"),
    ("a=x,a=y", "twice"),
  ):
    with pytest.raises(ValueError, match=match):
      evaluation_sets.parse(bad)


def test_named_streams_in_order(root, prepared):
  cfg = small(root, eval_sets=f"books={root}/books/*.txt,news={root}/news.txt")
  sets = data.eval_sets(cfg, prepared)
  assert list(sets) == ["books", "news"]
  tok = prepared.tokenizer
  books = [*stories.generate(10, seed=10), *stories.generate(10, seed=11)]
  assert np.asarray(sets["books"]).tolist() == framed(tok, books)
  assert np.asarray(sets["news"]).tolist() == framed(tok, list(stories.generate(5, seed=20)))
  assert data.eval_sets(small(root), prepared) == {}  # the corpus's own validation split is not an eval set


def test_cached_and_keyed_by_files_and_tokenizer(root, prepared, monkeypatch):
  cfg = small(root, eval_sets=f"news={root}/news.txt")
  first = data.eval_sets(cfg, prepared)["news"]
  monkeypatch.setattr(evaluation_sets, "build", lambda *a, **k: pytest.fail("rebuilt a complete eval set"))
  again = data.eval_sets(cfg, prepared)["news"]
  assert again.filename == first.filename
  monkeypatch.undo()
  other = data.prepare(small(root, vocab_size=400))  # another tokenizer: another cache
  retokenized = data.eval_sets(cfg, other)["news"]
  assert retokenized.filename != first.filename
  assert np.asarray(retokenized).tolist() == framed(other.tokenizer, list(stories.generate(5, seed=20)))
  os.utime(root / "news.txt", (1, 1))  # a changed file: another cache
  assert data.eval_sets(cfg, prepared)["news"].filename != first.filename


def test_too_short_set_names_itself_and_its_tokens(root, prepared):
  cfg = small(root, eval_sets=f"news={root}/news.txt,tiny={root}/tiny.txt")
  with pytest.raises(
    ValueError,
    match=r"eval set 'tiny' \(.*tiny.txt\) has \d+ tokens, fewer than one window of "
    r"seq_len \+ 1 = 33",
  ):
    data.eval_sets(cfg, prepared)
  with pytest.raises(FileNotFoundError, match="eval set 'gone': no file matches"):
    data.eval_sets(small(root, eval_sets=f"gone={root}/gone/*.txt"), prepared)


def test_eval_windows_are_what_eval_batches_gives(prepared):
  tokens = prepared.tokens("validation")
  for batch_size, num_batches in ((2, 3), (4, 50)):
    windows = list(data.eval_windows(tokens, batch_size, 16, num_batches))
    batches = list(data.eval_batches(prepared, batch_size, 16, num_batches))
    assert len(windows) == num_batches and all(np.array_equal(w, b) for w, b in zip(windows, batches))
  with pytest.raises(ValueError, match="eval set 'x' has 10 tokens, fewer than one window of seq_len \\+ 1 = 17"):
    data.eval_windows(np.arange(10), 2, 16, 1, name="eval set 'x'")
  with pytest.raises(ValueError, match="num_batches must be positive"):
    data.eval_windows(tokens, 2, 16, 0)


def test_filtered_keeps_exactly_the_evaluated_windows_whose_tokens_the_training_sample_has():
  rng = np.random.default_rng(0)
  train, stream = rng.integers(0, 12, 40), rng.integers(0, 16, 4 * 9 + 5)  # ids 12…15 never occur in training
  seen_V = evaluation_sets.seen_tokens(train, 16)
  assert seen_V.tolist() == [i in set(train.tolist()) for i in range(16)]
  assert evaluation_sets.seen_tokens(train, 16, sample_tokens=5).tolist() == [
    i in set(train[:5].tolist()) for i in range(16)
  ]
  expected = []  # by hand: the windows evaluation reads (non-overlapping, 9 tokens each), kept when all ids are seen
  for start in range(0, len(stream) - 8, 9):
    if all(seen_V[t] for t in stream[start : start + 9]):
      expected += stream[start : start + 9].tolist()
  got = evaluation_sets.filtered(stream, seen_V, seq_len=8)
  assert got.tolist() == expected and 0 < len(expected) < 36
  windows = next(data.eval_windows(got, len(expected) // 9, 8, 1, "the filtered set"))
  assert windows.reshape(-1).tolist() == expected  # evaluation reads those windows, each once


def test_filtered_eval_sets_are_evaluated_beside_their_sets(root, prepared):
  cfg = small(
    root,
    eval_sets=f"books={root}/books/*.txt,news={root}/news.txt",
    filtered_eval_sets="books",
    filter_sample_tokens=2000,
  )
  sets = data.eval_sets(cfg, prepared)
  assert list(sets) == ["books", "news", "books_filtered"]
  seen_V = evaluation_sets.seen_tokens(prepared.tokens("train")[:2000], prepared.tokenizer.vocab_size)
  np.testing.assert_array_equal(sets["books_filtered"], evaluation_sets.filtered(sets["books"], seen_V, 32))
  assert 0 < sets["books_filtered"].size < sets["books"].size  # a small sample leaves some ids unseen
  with pytest.raises(
    ValueError,
    match="data.filtered_eval_sets names 'wiki', which is neither val nor in data.eval_sets "
    r"\(books\); name one of those",
  ):
    data.eval_sets(small(root, eval_sets=f"books={root}/books/*.txt", filtered_eval_sets="wiki"), prepared)


def test_the_validation_split_filtered_is_its_windows_whose_tokens_training_has(root, prepared):
  sets = data.eval_sets(small(root, filtered_eval_sets="val", filter_sample_tokens=2000), prepared)
  assert list(sets) == ["val_filtered"]
  seen_V = evaluation_sets.seen_tokens(prepared.tokens("train")[:2000], prepared.tokenizer.vocab_size)
  val = prepared.tokens("validation")
  np.testing.assert_array_equal(sets["val_filtered"], evaluation_sets.filtered(val, seen_V, 32))
  assert 0 < sets["val_filtered"].size < val.size and seen_V[sets["val_filtered"]].all()
