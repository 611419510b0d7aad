"""Train-step throughput: `python -m experiments.benchmark_train [--sizes=1m,30m] [--batch=16] [--seq=512]`.

Baseline vs TaperNorm mid-taper vs the g = 0 fast step, side by side in one process, and the
data loader alone (the share of a step spent waiting for data). Prints a markdown table and
writes results.json and table.md under --out.
"""

import os

from absl import app, flags

from tapernorm_jax.benchmarks import train as bench
from tapernorm_jax.files import write_json_atomically, write_text_atomically

_SIZES = flags.DEFINE_list("sizes", ["1m", "30m"], "Model sizes (configs/base.py SIZES).")
_BATCH = flags.DEFINE_integer("batch", 16, "Global batch size.")
_SEQ = flags.DEFINE_integer("seq", 512, "Sequence length T.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Repeats (median and spread reported).")
_OUT = flags.DEFINE_string("out", "runs/benchmark_train", "Output directory.")


def main(argv: list[str]) -> None:
  """Runs every size and case, prints and saves the table."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  results = bench.run(bench.Settings(tuple(_SIZES.value), _BATCH.value, _SEQ.value, _STEPS.value, _REPEATS.value))
  table = bench.markdown(results)
  print("\n" + table)
  os.makedirs(_OUT.value, exist_ok=True)
  write_json_atomically(os.path.join(_OUT.value, "results.json"), results)
  write_text_atomically(os.path.join(_OUT.value, "table.md"), table + "\n")


if __name__ == "__main__":
  app.run(main)
