"""Checks a GPU or TPU host in one run: `python -m experiments.accelerator_check [--out=DIR] [--smoke]`.

Runs the accelerator-relevant tests (bf16 norms and fold, the attention implementation `auto`
selects, sharded steps over every local device), then the train-step and inference benchmarks in
bf16, and writes results.json and report.md (with the paper's H100 numbers beside the measured
ones) under --out. About 5 minutes on one modern GPU; `--smoke` is the one-minute CPU version CI runs.
What runs: `tapernorm_jax/benchmarks/accelerator.py`. Exits 1 if any part failed.
"""

import os
import sys

from absl import flags

from tapernorm_jax import cli
from tapernorm_jax.benchmarks import accelerator
from tapernorm_jax.files import write_report

_SETTINGS = cli.define_flags(accelerator.Settings, {
    "smoke": "Tiny CPU preset (what CI runs).", "tests": "Run the accelerator test subset.",
    "train": "Run the train-step benchmark.", "inference": "Run the forward and decode benchmarks.",
    "test_timeout_s": "Seconds before the test subprocess is stopped."})
_OUT = flags.DEFINE_string("out", "runs/accelerator_check", "Output directory for results.json and report.md.")


def main(argv: list[str]) -> None:
  """Entry point."""
  settings = cli.settings(argv, accelerator.Settings, _SETTINGS)
  results = accelerator.run(settings, _OUT.value)
  report = accelerator.markdown(results)
  path = write_report(_OUT.value, results, report, "report.md")
  print("\n" + report)
  print(f"wrote {path} and report.md")
  if not accelerator.ok(results):
    sys.exit(f"error: the accelerator check found failures; see {os.path.join(_OUT.value, 'report.md')}")


if __name__ == "__main__":
  cli.run(main)
