"""Page faults of this project's train step beside PyTorch's in one process, the way `benchmark_peer --modes=train`
ran them before each contender got a process of its own (from the repository root): a few of our steps alone, then
rounds of HF eager steps (at least 3 s) each followed by a few of ours; each step's time and minor page faults, and
the process's resident memory, printed.

    /path/to/peer-venv/bin/python -m scripts.peer_heap_faults 1m:16x512
    TAPERNORM_KEEP_FREED_MEMORY=0 /path/to/peer-venv/bin/python -m scripts.peer_heap_faults 1m:16x512

Needs the `peer` extra (torch, transformers). Malloc keeps freed memory in one heap for the whole process (unless
turned off as above), so PyTorch's allocations and XLA:CPU's share it. A development tool: the package never
imports it.
"""

import sys
import tempfile
import time

from tapernorm_jax.runtime import allocator

allocator.keep_freed_memory()  # as the entry points set malloc, before jax starts

import torch  # noqa: E402

from experiments.peer_train_hf import HuggingFaceStep  # noqa: E402
from tapernorm_jax.benchmarks.pytorch import training  # noqa: E402
from tapernorm_jax.benchmarks.step_profile import minor_faults  # noqa: E402

ROUNDS, OUR_STEPS = 4, 3


def resident_gb() -> float:
  """The process's resident memory (VmRSS), GB."""
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1e6


def timed(call) -> tuple[float, int]:
  """(seconds, page faults) of one call."""
  f0, t0 = minor_faults(), time.perf_counter()
  call()
  return time.perf_counter() - t0, minor_faults() - f0


def step_line(call) -> str:
  """One call's seconds and page faults, and the resident memory after it."""
  seconds, count = timed(call)
  return f"{seconds:.3f} s, {count} faults, resident {resident_gb():.2f} GB"


def main(cell: str) -> None:
  """Our steps alone, then rounds of HF eager steps each followed by our steps; one line per step."""
  torch.set_num_threads(2)
  directory = tempfile.mkdtemp(prefix="tapernorm-peer-heap-")
  spec = {"cell": cell, "seed": 0, "dtype": "float32", "directory": directory, "threads": 2, "device": "cpu"}
  step = training.OurStep({**spec, "contender": "baseline"})  # writes the weights and batch the peer loads
  described = step.describe()
  peer = HuggingFaceStep(
    {**spec, "contender": "hf_eager", "optimizer": described["optimizer"], "dtypes": described["dtypes"]}
  )
  peer.check()  # the first step picks the form (eager, fused AdamW)
  hf = lambda: peer.wait(peer.step())
  ours = lambda: step.wait(step.step())

  print(f"{cell}, malloc: {allocator.keep_freed_memory() or 'keeps freed memory'}", flush=True)
  for i in range(6):
    print(f"ours alone, step {i}: {step_line(ours)}", flush=True)
  for r in range(ROUNDS):
    t0, hf_steps, hf_faults = time.perf_counter(), 0, 0
    while time.perf_counter() - t0 < 3:
      hf_faults += timed(hf)[1]
      hf_steps += 1
    print(
      f"round {r}: HF eager {hf_steps} steps, {hf_faults // hf_steps} faults per step, resident {resident_gb():.2f} GB",
      flush=True,
    )
    for i in range(OUR_STEPS):
      print(f"round {r}, ours step {i}: {step_line(ours)}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "1m:16x512")
