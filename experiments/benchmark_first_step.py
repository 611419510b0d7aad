"""Time to first step with jax's persistent compilation cache, cold and warm: `python -m
experiments.benchmark_first_step [--cases=dev_train,step_30m] [--rounds=3]`.

Each measurement is a fresh process (this module again, with --child); cold and warm alternate round by round.
Prints a markdown table and writes results.json and table.md under --out.
"""

import time

STARTED = time.time()  # a child's clock starts before anything heavy is imported

import json  # noqa: E402

from absl import flags  # noqa: E402

from tapernorm_jax import cli  # noqa: E402
from tapernorm_jax.benchmarks import first_step as bench  # noqa: E402
from tapernorm_jax.storage.run_files import write_report  # noqa: E402

_SETTINGS = cli.define_flags(
  bench.Settings, {"cases": f"Which of {', '.join(bench.CASES)}.", "rounds": "Cold/warm rounds per case."}
)
_OUT = flags.DEFINE_string("out", "runs/benchmark_first_step", "Output directory.")
_CHILD = flags.DEFINE_string("child", "", "(internal) run one case in this process and print its time.")
_CACHE = flags.DEFINE_string("cache", "off", "(internal, with --child) the compilation cache directory.")
_WORKDIR = flags.DEFINE_string("workdir", "", "(internal, with --child) the run directory.")


def main(argv: list[str]) -> None:
  """Measures every case (or, with --child, one run of one case)."""
  if _CHILD.value:
    print(json.dumps({"first_step_s": bench.child(_CHILD.value, _CACHE.value, _WORKDIR.value, STARTED)}))
    return
  results = bench.run(cli.settings(argv, bench.Settings, _SETTINGS))
  table = bench.markdown(results)
  print("\n" + table)
  write_report(_OUT.value, results, table)


if __name__ == "__main__":
  cli.run(main)
