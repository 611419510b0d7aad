"""Data preparation and loader speed: tokenizer training and tokenizing from scratch, cache reload, loader tokens/s."""

import dataclasses
import os
import platform
import tempfile
import time
from typing import Any

from tapernorm_jax import data
from tapernorm_jax.benchmarks.timing import check_at_least, seconds_per_batch
from tapernorm_jax.data import stories


@dataclasses.dataclass
class Settings:
  """Corpus size, tokenizer and loader shape (defaults: ~20 MB, the paper's vocabulary, batch and length)."""

  stories: int = 40_000
  vocab_size: int = 10_000
  batch_size: int = 16
  seq_len: int = 512
  batches: int = 3_000
  data_dir: str = ""  # "" = a fresh temporary directory

  def __post_init__(self):
    check_at_least(self, 1, "stories", "vocab_size", "batch_size", "seq_len", "batches")


def loader_rate(iterator: Any, s: Settings, num_batches: int) -> dict[str, float]:
  """Tokens/s and ms per batch of `num_batches` calls to `next(iterator)`."""
  seconds = seconds_per_batch(iterator, num_batches)
  return dict(tokens_per_s=s.batch_size * (s.seq_len + 1) / seconds, ms_per_batch=1e3 * seconds)


def run(s: Settings) -> dict[str, Any]:
  """Prepares the offline corpus from scratch (in a temporary directory, removed after, unless `data_dir` is
  given), reloads it from the cache, and times the loaders."""
  if s.data_dir:
    return timed(s, s.data_dir)
  with tempfile.TemporaryDirectory(prefix="tapernorm-benchmark-data-") as data_dir:
    return timed(s, data_dir)


def timed(s: Settings, data_dir: str) -> dict[str, Any]:
  """The benchmark with the corpus prepared into `data_dir`."""
  cfg = dict(
    source="synthetic",
    data_dir=data_dir,
    synthetic_train_stories=s.stories,
    synthetic_valid_stories=max(1, s.stories // 20),
    synthetic_seed=0,
    vocab_size=s.vocab_size,
    seq_len=s.seq_len,
  )
  t0 = time.perf_counter()
  text_bytes = sum(len(story.encode("utf-8")) for story in stories.generate(s.stories, 0, "train"))
  generate_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  prepared = data.prepare(cfg)
  prepare_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  data.prepare(cfg)
  reload_s = time.perf_counter() - t0

  loaders = {}
  for threads, prefetch in ((0, 0), (1, 16), (2, 32)):
    it = data.train_iterator(
      prepared,
      s.batch_size,
      s.seq_len,
      seed=0,
      process_index=0,
      process_count=1,
      num_threads=threads,
      prefetch=prefetch,
    )
    loaders[f"train_threads={threads}_prefetch={prefetch}"] = loader_rate(it, s, s.batches)
  num_eval = max(1, min(s.batches, prepared.num_tokens("validation") // (s.batch_size * (s.seq_len + 1))))
  loaders["eval"] = loader_rate(data.eval_batches(prepared, s.batch_size, s.seq_len, num_eval + 1), s, num_eval)
  return dict(
    benchmark="data",
    corpus=prepared.name,
    machine=dict(platform=platform.platform(), cpus=os.cpu_count()),
    train_text_mb=text_bytes / 1e6,
    vocab_size=prepared.vocab_size,
    num_tokens={split: prepared.num_tokens(split) for split in ("train", "validation")},
    generate_corpus_s=generate_s,
    prepare_s=prepare_s,
    reload_cached_s=reload_s,
    build_timings_s=prepared.meta["timings"],
    batch_size=s.batch_size,
    seq_len=s.seq_len,
    loader=loaders,
  )
