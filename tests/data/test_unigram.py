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


def test_validation_targets_never_seen_in_training_are_named_with_the_field_that_fixes_them():
  train = np.array([0, 1, 2, 1, 0], np.uint16)
  windows = [np.array([[0, 1, 3, 3], [2, 2, 1, 4]], np.int32)]  # targets 1 3 3 | 2 1 4: ids 3 and 4 never trained
  ref = unigram.reference(train, windows, 6)
  message = unigram.unseen_warning(ref, 6, "corpus-x", 6)
  assert message.startswith("3 of the 6 validation targets evaluated on corpus-x have a token id that never occurs")
  assert "a smaller data.vocab_size (model.V=6 now)" in message
  assert unigram.unseen_warning(unigram.reference(train, [windows[0][:, :2]], 6), 2, "corpus-x", 6) is None
