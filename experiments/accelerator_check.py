"""Checks a GPU or TPU host in one run: `python -m experiments.accelerator_check [--out=DIR] [--smoke]`.

Runs the accelerator-relevant tests on this host's default backend (bf16 norms and fold, the attention
implementation `auto` selects, sharded steps over every local device), then the train-step benchmark in
bf16 with its MFU, the inference benchmarks and, where torch and transformers are installed, the same
forward grid with Hugging Face eager and torch.compile; writes results.json and report.md (with the
paper's H100 numbers beside the measured ones and each part's time) under --out. Aimed at under 8
minutes on one H100/H200; `--smoke` is the one-minute CPU version CI runs. What runs:
`tapernorm_jax/benchmarks/accelerator.py`. Exits 1 if any part failed, or if the tests ran on another
platform than the benchmarks.
"""

import os
import sys

from absl import flags

from tapernorm_jax import cli
from tapernorm_jax.benchmarks import accelerator
from tapernorm_jax.storage.run_files import write_report

_SETTINGS = cli.define_flags(
  accelerator.Settings,
  {
    "smoke": "Tiny CPU preset (what CI runs).",
    "tests": "Run the accelerator test subset.",
    "train": "Run the train-step benchmark.",
    "inference": "Run the forward and decode benchmarks.",
    "peer": "Run the forward grid beside Hugging Face (needs torch and transformers; skipped without).",
    "test_timeout_s": "Seconds before the test subprocess is stopped.",
    "peer_timeout_s": "Seconds before the Hugging Face subprocess is stopped.",
    "checkout": "A clone of the repository whose tests and peer script to run (default: the one installed from).",
  },
)
_OUT = flags.DEFINE_string("out", "runs/accelerator_check", "Output directory for results.json and report.md.")


def main(argv: list[str]) -> None:
  """Entry point."""
  settings = cli.settings(argv, accelerator.Settings, _SETTINGS)
  os.environ.update(accelerator.SHARED_DEVICE_ENV)  # before jax takes the device: its subprocesses need it too
  results = accelerator.run(settings, _OUT.value)
  report = accelerator.markdown(results)
  path = write_report(_OUT.value, results, report, "report.md")
  print("\n" + report)
  print(f"wrote {path} and report.md")
  if results.get("placement_problems"):
    sys.exit(
      "error: the accelerator check's tests did not run on the benchmarks' platform ("
      f"{'; '.join(results['placement_problems'])}); see {os.path.join(_OUT.value, 'report.md')}"
    )
  if not accelerator.ok(results):
    sys.exit(f"error: the accelerator check found failures; see {os.path.join(_OUT.value, 'report.md')}")


if __name__ == "__main__":
  cli.run(main)
