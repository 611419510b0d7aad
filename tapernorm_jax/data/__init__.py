"""Data: corpora (offline stories, TinyStories, text files), tokenizer, cached token streams, grain pipeline."""

from tapernorm_jax.data.pipeline import eval_batches, train_iterator
from tapernorm_jax.data.prepared import Prepared, prepare

__all__ = ["Prepared", "eval_batches", "prepare", "train_iterator"]
