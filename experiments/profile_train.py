"""Where a train step's time goes: `python -m experiments.profile_train [--cells=1m:16x512,9m:4x512,30m:1x512]`.

Traces a few optimiser steps per cell with jax.profiler and groups XLA's per-op times by part of the
step (attention, projections, MLP, logits, loss, optimiser, layout copies, time with no op running);
prints a markdown table and writes results.json and table.md under --out.
"""

from absl import flags

from tapernorm_jax import cli
from tapernorm_jax.runtime import hardware
from tapernorm_jax.benchmarks import step_profile
from tapernorm_jax.benchmarks.pytorch import training
from tapernorm_jax.storage.run_files import write_report

_CELLS = flags.DEFINE_list("cells", list(training.CELLS), "Cells SIZE:BATCHxT to profile.")
_VARIANT = flags.DEFINE_string("variant", "baseline", "Variant (TaperNorm variants are profiled mid-taper).")
_CPU_PATHS = flags.DEFINE_string(
  "cpu_paths",
  "auto",
  "The products and attention, as train.cpu_paths: auto (what "
  "a run picks here), xla (the model's own), kernels, ... (train/kernel_choice.py).",
)
_STEPS = flags.DEFINE_integer("steps", 3, "Traced steps per cell (after one untraced warm-up step).")
_OUT = flags.DEFINE_string("out", "runs/profile_train", "Output directory.")


def main(argv: list[str]) -> None:
  """Profiles every cell, prints and saves the table."""
  for cell in _CELLS.value:
    training.parse_cell(cell)
  if _STEPS.value < 1:
    raise ValueError(f"--steps={_STEPS.value}: must be >= 1")
  profiles = {
    cell: step_profile.profile_cell(cell, _VARIANT.value, _STEPS.value, cpu_paths=_CPU_PATHS.value)
    for cell in _CELLS.value
  }
  table = step_profile.markdown(profiles)
  print("\n" + table)
  write_report(
    _OUT.value,
    {"hardware": hardware.describe(), "variant": _VARIANT.value, "cpu_paths": _CPU_PATHS.value, "profiles": profiles},
    table,
  )


if __name__ == "__main__":
  cli.run(main)
