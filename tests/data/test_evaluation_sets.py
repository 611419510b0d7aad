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
  return dict(source="synthetic", data_dir=str(tmp_path / "cache"), synthetic_train_stories=300,
              synthetic_valid_stories=30, vocab_size=500, seq_len=32) | overrides


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
  for bad, match in (("wiki", "not name=path_or_glob"), ("=x.txt", "not name=path_or_glob"),
                     ("a b=x.txt", "not name=path_or_glob"), ("val=x.txt", "reserved"), ("a=x,a=y", "twice")):
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
  with pytest.raises(ValueError, match=r"eval set 'tiny' \(.*tiny.txt\) has \d+ tokens, fewer than one window of "
                                       r"seq_len \+ 1 = 33"):
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
