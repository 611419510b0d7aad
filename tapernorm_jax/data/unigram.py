"""The unigram reference: the validation loss of a model that learned each token's frequency and no context.

A run whose validation loss sits at this reference learned the tokens' frequencies and nothing of their context; the
study tools mark such runs instead of averaging them (studies/analysis/run_rows.py). It is computed from the run's own
data: token frequencies of the training stream (add-one smoothed, so an id never seen in training has a finite cost)
scored on the very windows the run evaluates.
"""

from collections.abc import Iterable

import numpy as np

CHUNK = 1 << 24  # tokens counted per bincount call (an int64 copy of a 470M-token stream would take 3.8 GB)


def counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
  """How often each id occurs in `tokens`, shape (vocab_size,), int64."""
  counts_V = np.zeros(vocab_size, np.int64)
  for start in range(0, tokens.shape[0], CHUNK):
    counts_V += np.bincount(np.asarray(tokens[start : start + CHUNK]), minlength=vocab_size)[:vocab_size]
  return counts_V


def reference(train_tokens: np.ndarray, windows_BxT1: Iterable[np.ndarray], vocab_size: int) -> dict[str, float | int]:
  """`unigram_val_loss` (nats/token) on the targets of `windows_BxT1` (each window's tokens after its first), and
  `val_unseen_tokens`, how many of those targets have an id that never occurs in `train_tokens`."""
  counts_V = counts(train_tokens, vocab_size)
  log_p_V = np.log(counts_V + 1.0) - np.log(counts_V.sum() + vocab_size)
  targets_N = np.concatenate([np.asarray(w)[:, 1:].ravel() for w in windows_BxT1])
  return {
    "unigram_val_loss": float(-log_p_V[targets_N].mean()),
    "val_unseen_tokens": int((counts_V[targets_N] == 0).sum()),
  }


def unseen_warning(ref: dict[str, float | int], num_targets: int, corpus: str, vocab_size: int) -> str | None:
  """The warning for validation targets whose id never occurs in training (None where there are none): their
  embeddings are never trained, so the loss on them says nothing of the model (the 1M soak's g = 0 validation loss
  reached 9e12 on 185 such targets; docs/guarantees.md)."""
  unseen = int(ref["val_unseen_tokens"])
  if unseen == 0:
    return None
  return (
    f"{unseen:,} of the {num_targets:,} validation targets evaluated on {corpus} have a token id that never "
    f"occurs in its training stream: their embeddings are never trained (tied, they only drift), and the "
    f"validation loss on them can blow up. Fit the tokenizer to the corpus: a smaller data.vocab_size "
    f"(model.V={vocab_size} now), or more training text; data.filtered_eval_sets=val also evaluates the "
    f"validation windows without them (val_filtered)"
  )
