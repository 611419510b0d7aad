"""The offline story corpus: deterministic by seed, prefix-stable, varied, and simple English."""

from tapernorm_jax.data import stories


def test_same_seed_same_stories():
  assert list(stories.generate(20, seed=3)) == list(stories.generate(20, seed=3))


def test_other_seed_or_split_other_stories():
  base = list(stories.generate(20, seed=0))
  assert base != list(stories.generate(20, seed=1))
  assert set(base).isdisjoint(stories.generate(20, seed=0, split="validation"))


def test_any_size_shares_its_first_stories():
  assert list(stories.generate(50, seed=0))[:10] == list(stories.generate(10, seed=0))


def test_stories_have_characters_dialogue_and_paragraphs():
  corpus = list(stories.generate(200, seed=0))
  assert len(set(corpus)) == len(corpus)
  assert all(s.strip() == s and len(s) > 100 for s in corpus)
  assert sum('"' in s for s in corpus) > 150  # dialogue
  assert all("\n" in s for s in corpus)  # paragraphs
  assert len({s.split(".")[0] for s in corpus}) > 100  # openings vary
  assert all(s.isascii() for s in corpus)


def test_bad_split_is_an_error():
  try:
    next(stories.generate(1, split="test"))
  except ValueError as e:
    assert "split" in str(e)
  else:
    raise AssertionError("expected a ValueError")
