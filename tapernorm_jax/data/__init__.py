"""Data: corpora (stories, TinyStories, text files, OpenWebText), the tokenizer choice, cached token streams, grain."""

from tapernorm_jax.data.evaluation_sets import eval_sets
from tapernorm_jax.data.pipeline import eval_batches, eval_windows, train_iterator
from tapernorm_jax.data.prepared import Prepared, prepare

__all__ = ["Prepared", "eval_batches", "eval_sets", "eval_windows", "prepare", "train_iterator"]
