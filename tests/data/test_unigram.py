"""The unigram reference (data/unigram.py) against a count and a cross-entropy written out by hand."""

import collections
import math

import numpy as np
import pytest

from tapernorm_jax.data import unigram


def test_the_reference_is_the_add_one_unigram_cross_entropy_of_the_evaluated_targets(monkeypatch):
  monkeypatch.setattr(unigram, "CHUNK", 7)  # counts over several chunks, as a long stream is counted
  rng = np.random.default_rng(0)
  V = 12
  train = rng.choice(10, size=500, p=np.arange(1, 11) / 55).astype(np.uint16)  # ids 10 and 11 never occur
  windows = [rng.integers(0, V, size=(3, 9)).astype(np.int32) for _ in range(2)]
  seen = collections.Counter(int(t) for t in train)
  targets = [int(t) for w in windows for row in w for t in row[1:]]
  expected = -sum(math.log((seen[t] + 1) / (len(train) + V)) for t in targets) / len(targets)
  got = unigram.reference(train, windows, V)
  assert got["unigram_val_loss"] == pytest.approx(expected, rel=1e-12)
  assert got["val_unseen_tokens"] == sum(t >= 10 for t in targets) > 0
  assert list(unigram.counts(train, V)) == [seen[i] for i in range(V)]
