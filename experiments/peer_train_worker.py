"""One contender of the peer benchmark's train mode in a process of its own: `python -m experiments.peer_train_worker
SPEC`, started by experiments/benchmark_peer.py (tapernorm_jax/benchmarks/peer_train.py), never by hand.

SPEC is JSON: the contender (baseline, taper, hf_eager or hf_compiled), the cell, the seed, the directory the
baseline writes its initial weights and batch to, and for the peer the optimiser, dtypes and device the baseline
reported. malloc is set before torch or jax is imported: experiments/__init__.py calls `keep_freed_memory()` first,
honouring the row's TAPERNORM_KEEP_FREED_MEMORY, and this module asks it again, before any other import, for what
holds. This project's contenders import no torch, the peer's no jax. Replies go to the original stdout, one JSON
line per command (tapernorm_jax/benchmarks/workers.py); whatever a library prints goes to stderr.
"""

import json
import os
import sys

from tapernorm_jax import allocator

_WHY_NOT = allocator.keep_freed_memory()  # '' when set: one arena, no mmap, no trimming
ALLOCATOR = {"setting": "default" if _WHY_NOT else "project settings", "keep_freed_memory": _WHY_NOT or "set",
             "before_jax_and_torch": not {"jax", "torch"} & set(sys.modules)}

from tapernorm_jax.benchmarks import workers  # noqa: E402 (standard library only)


def contender(spec: dict) -> workers.Contender:
  """The contender SPEC names: the peer's (PyTorch) or this project's (jax)."""
  if spec["contender"].startswith("hf_"):
    from experiments import peer_train_hf  # noqa: PLC0415 (torch: only in the peer's processes)
    return peer_train_hf.HuggingFaceStep(spec)
  from tapernorm_jax.benchmarks import peer_train  # noqa: PLC0415 (jax: only in this project's processes)
  return peer_train.OurStep(spec)


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) != 2:
    sys.exit("usage: python -m experiments.peer_train_worker SPEC (JSON; started by experiments.benchmark_peer)")
  spec = json.loads(argv[1])
  replies = workers.protocol_stream()
  header = {"contender": spec["contender"], "pid": os.getpid(), "allocator": ALLOCATOR}
  workers.serve(lambda: contender(spec), sys.stdin, replies, header)


if __name__ == "__main__":
  main(sys.argv)
