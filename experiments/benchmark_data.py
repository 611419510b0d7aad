"""Data benchmark: `python -m experiments.benchmark_data [--stories=40000 --vocab_size=10000]`.

Prepares ~20 MB of the offline story corpus from scratch (tokenizer training, then tokenizing
both splits), reloads it from the cache, and measures the loader alone: tokens/s of
`train_iterator` (in-thread and with read-ahead threads) and of `eval_batches`. Prints the
result and writes it as JSON to --out.
"""

import json
import os
import platform
import tempfile
import time

from absl import app, flags

from tapernorm_jax import data
from tapernorm_jax.data import stories

_STORIES = flags.DEFINE_integer("stories", 40_000, "Training stories (~500 bytes each; 40,000 is ~20 MB).")
_VOCAB = flags.DEFINE_integer("vocab_size", 10_000, "Tokenizer vocabulary (the paper's 10,000).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Loader batch size (the paper's 16).")
_SEQ = flags.DEFINE_integer("seq_len", 512, "Window length T; windows hold T + 1 tokens (the paper's 512).")
_BATCHES = flags.DEFINE_integer("batches", 3_000, "Batches timed per loader setting.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Cache root (default: a fresh temporary directory).")
_OUT = flags.DEFINE_string("out", "runs/benchmark_data.json", "Where to write the JSON result.")


def loader_rate(iterator, num_batches: int, batch_size: int, seq_len: int) -> dict:
  """Tokens/s and ms per batch of `num_batches` calls to `next(iterator)` after one warm-up call."""
  next(iterator)
  t0 = time.perf_counter()
  for _ in range(num_batches):
    next(iterator)
  seconds = time.perf_counter() - t0
  return dict(tokens_per_s=num_batches * batch_size * (seq_len + 1) / seconds, ms_per_batch=1e3 * seconds / num_batches)


def main(argv: list[str]) -> None:
  """Runs the benchmark and writes the JSON result."""
  del argv
  data_dir = _DATA_DIR.value or tempfile.mkdtemp(prefix="tapernorm-benchmark-data-")
  num_valid = max(1, _STORIES.value // 20)
  cfg = dict(source="synthetic", data_dir=data_dir, synthetic_train_stories=_STORIES.value,
             synthetic_valid_stories=num_valid, synthetic_seed=0, vocab_size=_VOCAB.value, seq_len=_SEQ.value)

  t0 = time.perf_counter()
  text_bytes = sum(len(s.encode("utf-8")) for s in stories.generate(_STORIES.value, 0, "train"))
  generate_s = time.perf_counter() - t0

  t0 = time.perf_counter()
  prepared = data.prepare(cfg)
  prepare_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  data.prepare(cfg)
  reload_s = time.perf_counter() - t0

  batch, seq = _BATCH.value, _SEQ.value
  loaders = {}
  for threads, prefetch in ((0, 0), (1, 16), (2, 32)):
    it = data.train_iterator(prepared, batch, seq, seed=0, process_index=0, process_count=1, num_threads=threads,
                             prefetch=prefetch)
    loaders[f"train_threads={threads}_prefetch={prefetch}"] = loader_rate(it, _BATCHES.value, batch, seq)
  num_eval = max(1, min(_BATCHES.value, prepared.num_tokens("validation") // (batch * (seq + 1))))
  loaders["eval"] = loader_rate(data.eval_batches(prepared, batch, seq, num_eval + 1), num_eval, batch, seq)

  result = dict(
      benchmark="data", corpus=prepared.name, machine=dict(platform=platform.platform(), cpus=os.cpu_count()),
      train_text_mb=text_bytes / 1e6, vocab_size=prepared.vocab_size,
      num_tokens={s: prepared.num_tokens(s) for s in ("train", "validation")},
      generate_corpus_s=generate_s, prepare_s=prepare_s, reload_cached_s=reload_s,
      build_timings_s=prepared.meta["timings"], batch_size=batch, seq_len=seq, loader=loaders)
  text = json.dumps(result, indent=2)
  print(text)
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value, "w") as f:
    f.write(text + "\n")
  print(f"prepared {result['train_text_mb']:.1f} MB of {prepared.name} in {prepare_s:.1f} s "
        f"(tokenizer {prepared.meta['timings']['tokenizer_train_s']:.1f} s); loader "
        f"{loaders['train_threads=0_prefetch=0']['tokens_per_s'] / 1e6:.1f} M tokens/s; written to {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
