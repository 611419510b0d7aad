"""Data benchmark: `python -m experiments.benchmark_data [--stories=40000 --vocab_size=10000]`.

Prepares ~20 MB of the offline story corpus from scratch (tokenizer training, then tokenizing
both splits), reloads it from the cache, and measures the loader alone: tokens/s of
`train_iterator` (in-thread and with read-ahead threads) and of `eval_batches`. Prints the
result and writes it as JSON to --out.
"""

import json
import os

from absl import flags

from tapernorm_jax import cli
from tapernorm_jax.benchmarks import data as bench
from tapernorm_jax.storage.run_files import write_json_atomically

_SETTINGS = cli.define_flags(
  bench.Settings,
  {
    "stories": "Training stories (~500 bytes each; 40,000 is ~20 MB).",
    "vocab_size": "Tokenizer vocabulary (the paper's 10,000).",
    "batch_size": "Loader batch size (the paper's 16).",
    "seq_len": "Window length T; windows hold T + 1 tokens (the paper's 512).",
    "batches": "Batches timed per loader setting.",
    "data_dir": "Cache root (default: a fresh temporary directory).",
  },
)
_OUT = flags.DEFINE_string("out", "runs/benchmark_data.json", "Where to write the JSON result.")


def main(argv: list[str]) -> None:
  """Runs the benchmark and writes the JSON result."""
  result = bench.run(cli.settings(argv, bench.Settings, _SETTINGS))
  print(json.dumps(result, indent=2))
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  write_json_atomically(_OUT.value, result)
  loader = result["loader"]["train_threads=0_prefetch=0"]
  print(
    f"prepared {result['train_text_mb']:.1f} MB of {result['corpus']} in {result['prepare_s']:.1f} s "
    f"(tokenizer {result['build_timings_s']['tokenizer_train_s']:.1f} s); loader "
    f"{loader['tokens_per_s'] / 1e6:.1f} M tokens/s; written to {_OUT.value}"
  )


if __name__ == "__main__":
  cli.run(main)
