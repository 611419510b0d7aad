"""Data: corpora (offline stories, TinyStories, text files), tokenizer, cached token streams, grain pipeline."""

from tapernorm_jax.data.pipeline import TimedIterator, eval_batches, train_iterator
from tapernorm_jax.data.cache import Prepared, prepare

__all__ = ["Prepared", "TimedIterator", "eval_batches", "prepare", "train_iterator"]
