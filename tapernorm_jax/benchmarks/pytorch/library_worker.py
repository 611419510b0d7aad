"""The peer train benchmark's library-built baseline:
`python -m tapernorm_jax.benchmarks.pytorch.library_worker SPEC`, started by benchmarks/pytorch/training.py,
never by hand.

The same step as the `baseline` contender (`training.OurStep`), in a process that starts as a user's script or
notebook does as docs/library.md tells it: `tapernorm_jax.runtime.allocator.keep_freed_memory()` first, then a
Trainer with `choose_paths()`, and nothing of experiments/ or `cli.run`. The benchmark times it beside the baseline
that an entry point started, so a process-level setting that only the entry points make shows up as a gap between
the two.
"""

import sys

from tapernorm_jax.runtime import allocator

allocator.keep_freed_memory()  # the documented call, before jax is imported

from tapernorm_jax.benchmarks.pytorch import training, workers  # noqa: E402 (after malloc's settings)

if __name__ == "__main__":
  workers.main(
    sys.argv,
    training.OurStep,
    "python -m tapernorm_jax.benchmarks.pytorch.library_worker SPEC (JSON; started by experiments.benchmark_peer)",
  )
