"""One contender of the peer benchmark's train mode in a process of its own: `python -m experiments.peer_train_worker
SPEC`, started by experiments/benchmark_peer.py (tapernorm_jax/benchmarks/pytorch/training.py), never by hand.

SPEC is JSON: the contender (baseline, taper, hf_eager or hf_compiled), the cell, the seed, the directory the
baseline writes its initial weights and batch to, and for the peer the optimiser, dtypes and device the baseline
reported. malloc is set before torch or jax is imported: experiments/__init__.py calls `keep_freed_memory()` first,
honouring the row's TAPERNORM_KEEP_FREED_MEMORY; the worker reports what holds (`workers.allocator_setting`). This
project's contenders import no torch, the peer's no jax. Replies go to the original stdout, one JSON
line per command (tapernorm_jax/benchmarks/pytorch/workers.py); whatever a library prints goes to stderr.
"""

import sys

from tapernorm_jax.benchmarks.pytorch import workers


def contender(spec: dict) -> workers.Contender:
  """The contender SPEC names: the peer's (PyTorch) or this project's (jax)."""
  if spec["contender"].startswith("hf_"):
    from experiments import peer_train_hf  # noqa: PLC0415 (torch: only in the peer's processes)

    return peer_train_hf.HuggingFaceStep(spec)
  from tapernorm_jax.benchmarks.pytorch import training  # noqa: PLC0415 (jax: only in this project's processes)

  return training.OurStep(spec)


def main(argv: list[str]) -> None:
  """Entry point."""
  workers.main(
    argv, contender, "python -m experiments.peer_train_worker SPEC (JSON; started by experiments.benchmark_peer)"
  )


if __name__ == "__main__":
  main(sys.argv)
