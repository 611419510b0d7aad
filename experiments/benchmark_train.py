"""Train-step throughput: `python -m experiments.benchmark_train [--sizes=1m,30m] [--batch=16] [--seq=512]`.

Baseline vs TaperNorm mid-taper vs the g = 0 fixed step, side by side in one process, and the
data loader alone (the share of a step spent waiting for data). Prints a markdown table and
writes results.json and table.md under --out.
"""

from absl import flags

from tapernorm_jax import cli
from tapernorm_jax.benchmarks import train as bench
from tapernorm_jax.storage.run_files import write_report

_SETTINGS = cli.define_flags(
  bench.Settings,
  {
    "sizes": "Model sizes (tapernorm_jax/train/run_config.py SIZES).",
    "batch": "Global batch size.",
    "seq": "Sequence length T.",
    "steps": "Timed steps per repeat.",
    "repeats": "Repeats (median and spread reported).",
  },
)
_OUT = flags.DEFINE_string("out", "runs/benchmark_train", "Output directory.")


def main(argv: list[str]) -> None:
  """Runs every size and case, prints and saves the table."""
  results = bench.run(cli.settings(argv, bench.Settings, _SETTINGS))
  table = bench.markdown(results)
  print("\n" + table)
  write_report(_OUT.value, results, table)


if __name__ == "__main__":
  cli.run(main)
