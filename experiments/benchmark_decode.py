"""Inference throughput of baseline, unfused, folded and identity models on the same weights (docs/method.md §9).

    python -m experiments.benchmark_decode             # the paper's grid: 30M, B ∈ {1, 4} × T ∈ {128, 256, 512}
    python -m experiments.benchmark_decode --quick     # a 1M-model smoke run in under a minute
    python -m experiments.benchmark_decode --size=9m --batches=1 --lengths=128,256 --repeats=7

Forms (one set of internal_taper weights, the paper's model): `baseline` runs the norms as
RMSNorm, `unfused` keeps the g = 0 map as an explicit `c·γ̃` multiply, `folded` has it folded
into QKV and the MLP input, and `identity` drops every norm (the upper bound). What is timed
and how: `tapernorm_jax/benchmarks/decode.py`. Writes `results.json` and `table.md` under --out.
"""

import dataclasses
import os

from absl import app, flags

from configs import base
from tapernorm_jax.benchmarks import decode as bench
from tapernorm_jax.files import write_json_atomically, write_text_atomically

_SIZE = flags.DEFINE_enum("size", "30m", list(base.SIZES), "Model size (the paper's 1m/3m/9m/30m, or cpu).")
_VARIANT = flags.DEFINE_enum("variant", "internal_taper", ["internal_taper", "all_taper"], "Which norms taper.")
_MODES = flags.DEFINE_list("modes", list(bench.MODES), "forward and/or decode.")
_BATCHES = flags.DEFINE_list("batches", ["1", "4"], "Batch sizes of the forward mode.")
_LENGTHS = flags.DEFINE_list("lengths", ["128", "256", "512"], "Sequence lengths T of the forward mode.")
_DECODE_BATCHES = flags.DEFINE_list("decode_batches", ["1", "4"], "Batch sizes of the decode mode.")
_PROMPT = flags.DEFINE_integer("prompt", 128, "Prompt length P of the decode mode.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "Tokens N generated per row in the decode mode.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed samples per form and cell (median and spread reported).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed calls per form and cell after compiling.")
_MIN_SAMPLE_S = flags.DEFINE_float("min_sample_s", 1.0, "Each timed sample loops calls for at least this long.")
_DTYPE = flags.DEFINE_string("dtype", "", "Compute and weight dtype (default: float32 on CPU, else bfloat16).")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke preset: 1m model, B=1, T=128, 3 repeats, 32 new tokens.")
_OUT = flags.DEFINE_string("out", "runs/benchmark_decode", "Output directory for results.json and table.md.")
_SEED = flags.DEFINE_integer("seed", 0, "Weight seed.")


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  settings = bench.Settings(
      size=_SIZE.value, variant=_VARIANT.value, modes=tuple(_MODES.value), batches=tuple(map(int, _BATCHES.value)),
      lengths=tuple(map(int, _LENGTHS.value)), decode_batches=tuple(map(int, _DECODE_BATCHES.value)),
      prompt=_PROMPT.value, new_tokens=_NEW_TOKENS.value, repeats=_REPEATS.value, warmup=_WARMUP.value,
      min_sample_s=_MIN_SAMPLE_S.value, dtype=_DTYPE.value, seed=_SEED.value)
  if _QUICK.value:
    settings = dataclasses.replace(settings, **bench.QUICK)
  results = bench.run(settings)
  table = bench.markdown(results)
  os.makedirs(_OUT.value, exist_ok=True)
  write_json_atomically(os.path.join(_OUT.value, "results.json"), results)
  write_text_atomically(os.path.join(_OUT.value, "table.md"), table + "\n")
  print("\n" + table)
  print(f"wrote {os.path.join(_OUT.value, 'results.json')} and table.md ({results['wall_s']:.0f} s)")


if __name__ == "__main__":
  app.run(main)
