"""Inference throughput of baseline, fixed, folded, identity, DyT and Derf models on the same weights (method.md §9).

    python -m experiments.benchmark_decode             # the paper's grid: 30M, B ∈ {1, 4} × T ∈ {128, 256, 512}
    python -m experiments.benchmark_decode --quick     # a 1M-model smoke run in under a minute
    python -m experiments.benchmark_decode --size=9m --batches=1 --lengths=128,256 --repeats=7

Forms (one set of internal_taper weights, the paper's model): `baseline` runs the norms as
RMSNorm, `fixed` keeps the g = 0 map as an explicit `c·γ̃` multiply, `folded` has it folded
into QKV and the MLP input, and `identity` drops every norm (the upper bound); `dyt` and `derf`
run the same weights with point-wise norms, which have no fold (--pointwise= leaves them out). What is timed
and how: `tapernorm_jax/benchmarks/decode.py`. Writes `results.json` and `table.md` under --out.
"""

import dataclasses

from absl import flags

from tapernorm_jax import cli
from tapernorm_jax.benchmarks import decode as bench
from tapernorm_jax.benchmarks import decode_tables
from tapernorm_jax.storage.run_files import write_report

_SETTINGS = cli.define_flags(bench.Settings, bench.FLAG_HELP)
_QUICK = flags.DEFINE_bool("quick", False, "Smoke preset: 1m model, B=1, T=128, 3 repeats, 32 new tokens.")
_OUT = flags.DEFINE_string("out", "runs/benchmark_decode", "Output directory for results.json and table.md.")


def main(argv: list[str]) -> None:
  """Entry point."""
  settings = cli.settings(argv, bench.Settings, _SETTINGS)
  if _QUICK.value:
    settings = dataclasses.replace(settings, **bench.QUICK)
  results = bench.run(settings)
  table = decode_tables.markdown(results)
  path = write_report(_OUT.value, results, table)
  print("\n" + table)
  print(f"wrote {path} and table.md ({results['wall_s']:.0f} s)")


if __name__ == "__main__":
  cli.run(main)
