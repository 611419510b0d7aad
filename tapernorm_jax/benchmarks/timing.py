"""Timing shared by the benchmarks: interleaved samples, throughput summaries, memory read bandwidth."""

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def check_at_least(settings: Any, minimum: float, *names: str) -> None:
  """Raises ValueError `name=value: must be >= minimum` for the first setting (or item of a tuple setting) below it."""
  for name in names:
    value = getattr(settings, name)
    if any(v < minimum for v in (value if isinstance(value, tuple) else (value,))):
      raise ValueError(f"{name}={value!r}: must be >= {minimum}" + (" (each)" if isinstance(value, tuple) else ""))


def time_interleaved(
  calls: dict[str, Callable[[], Any]], repeats: int, warmup: int, min_sample_s: float
) -> dict[str, list[float]]:
  """Seconds per call of each function: compile and warm-up, then `repeats` samples taken round-robin over the
  functions (so drifting machine load hits all of them alike), each sample looping for at least `min_sample_s`."""
  loops = {}
  for name, fn in calls.items():
    jax.block_until_ready(fn())  # compiles
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
      jax.block_until_ready(fn())
    per_call = (time.perf_counter() - t0) / max(warmup, 1)
    loops[name] = max(1, int(np.ceil(min_sample_s / max(per_call, 1e-9))))
  samples: dict[str, list[float]] = {name: [] for name in calls}
  for _ in range(repeats):
    for name, fn in calls.items():
      t0 = time.perf_counter()
      for _ in range(loops[name]):
        out = fn()
      jax.block_until_ready(out)
      samples[name].append((time.perf_counter() - t0) / loops[name])
  return samples


def summary(seconds: list[float], work: float) -> dict[str, Any]:
  """Throughput (work per second) from per-call times: median, min, max and the relative spread."""
  rates = sorted(work / s for s in seconds)
  median = statistics.median(rates)
  return {
    "median": median,
    "min": rates[0],
    "max": rates[-1],
    "spread": (rates[-1] - rates[0]) / median,
    "seconds": seconds,
  }


def paired_ratio(seconds: list[float], reference_seconds: list[float]) -> dict[str, float]:
  """How many times faster than a reference, from samples taken in the same rounds of `time_interleaved`: the
  median, min and max over rounds of the per-round ratio (a drift of the machine's speed that is slower than one
  round cancels out of each ratio, though not out of either throughput)."""
  ratios = sorted(ref / sec for sec, ref in zip(seconds, reference_seconds, strict=True))
  return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def bandwidth_probe(nbytes: int) -> Callable[[], jax.Array]:
  """A call that reads `nbytes` once: a jitted sum over an fp32 array of that size."""
  x = jnp.ones((max(nbytes // 4, 1),), jnp.float32)
  total = jax.jit(jnp.sum)
  return lambda: total(x)


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 7) -> dict[str, float]:
  """Read bandwidth (GB/s, median and best) of a jitted sum over `nbytes` bytes."""
  seconds = time_interleaved({"sum": bandwidth_probe(nbytes)}, repeats, warmup=1, min_sample_s=0.0)["sum"]
  return {
    "bytes": nbytes,
    "median_gb_s": nbytes / statistics.median(seconds) / 1e9,
    "best_gb_s": nbytes / min(seconds) / 1e9,
  }


def seconds_per_batch(iterator: Any, num_batches: int) -> float:
  """Mean seconds of `next(iterator)` over `num_batches` calls, after one warm-up call."""
  next(iterator)
  t0 = time.perf_counter()
  for _ in range(num_batches):
    next(iterator)
  return (time.perf_counter() - t0) / num_batches
