"""Choosing between implementations of a hot path by timing them on this host, at this shape, once (cached).

A kernel tuned on one CPU can lose on another (the fused attention and matrix products were tuned on AVX-512 hosts and
cost a third of a 9M step on an AVX2-only one), so where the project has more than one implementation of a path,
`choose` builds each candidate, times them in alternated rounds (a bounded cost: one compile and one untimed call per
candidate, then `ROUNDS` rounds of at least `SAMPLE_S` each, the clearly slower dropped after the first), logs what it
measured, and keeps the fastest. The result is cached like an autotuner's, as one JSON file per host signature and shape
under `$TAPERNORM_CACHE/autotune/`, so a host measures each shape once. A preferred candidate (the model's own) is kept
unless another beats it by `MARGIN`, so noise does not flip a choice between near-equal paths.
"""

import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jaxlib
import numpy as np

from tapernorm_jax import files
from tapernorm_jax.cpu_kernels import build

log = logging.getLogger(__name__)
ROUNDS = 3  # alternated rounds; each candidate's time is its median over them
SAMPLE_S = 0.05  # a round times each candidate for at least this long (repeating fast calls)
DROP = 1.5  # after the first round, candidates this many times slower than the fastest are not timed again
MARGIN = 0.03  # another candidate must be this much faster than the preferred one to be chosen
XLA, KERNELS = "xla", "kernels"  # the model's own products and attention; the CPU kernels that apply
ENV = "TAPERNORM_CPU_PATHS"  # what `auto` stands for in this process: `auto` (measure), or a path to force
Run = Callable[[], Any]  # one call of a candidate, returning only when its work is done


@dataclasses.dataclass(frozen=True)
class Choice:
  """The chosen candidate and how: `measured` here now, `cached` from an earlier measurement, `forced` by a config
  field or `$TAPERNORM_CPU_PATHS`, or `only` (one candidate); the measured median seconds per call of each."""

  name: str
  how: str
  seconds: dict[str, float] = dataclasses.field(default_factory=dict)
  measure_s: float = 0.0

  def record(self) -> dict[str, Any]:
    """As results.json and the benchmark tables record it."""
    return dataclasses.asdict(self)

  def describe(self) -> str:
    """`xla (measured: xla 0.281 s, kernels 0.412 s)`."""
    times = ", ".join(f"{name} {s:.3g} s" for name, s in sorted(self.seconds.items(), key=lambda kv: kv[1]))
    return f"{self.name} ({self.how}{': ' + times if times else ''})"


def host_signature() -> dict[str, Any]:
  """What a timing depends on besides the shape: the CPU model and its flags (as the kernels' builds key them), the
  cores this process may use, jaxlib, XLA's flags, the kernels' -march and the devices."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"cpu": hashlib.sha256(build.cpu_id().encode()).hexdigest()[:12], "cores": cores,
          "jaxlib": jaxlib.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""), "devices": jax.device_count(),
          "kernel_march": build.MARCH}


def cache_file(what: str, shape: dict[str, Any]) -> Path:
  """The cached choice of `what` at `shape` on this host."""
  key = json.dumps({"what": what, "shape": shape, "host": host_signature()}, sort_keys=True, default=str)
  return Path(files.cache_dir()) / "autotune" / f"{what}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def requested(forced: str | None) -> str:
  """The path asked for: `forced` unless it is auto (or None), then `$TAPERNORM_CPU_PATHS` (default auto)."""
  return forced if forced not in (None, "auto") else os.environ.get(ENV, "auto") or "auto"


def choose(what: str, label: str, shape: dict[str, Any], candidates: dict[str, Callable[[], Run]], prefer: str,
           forced: str | None = "auto") -> Choice:
  """The candidate for `what` at `shape` (`label` in the log): `forced` (or `$TAPERNORM_CPU_PATHS`) when not auto,
  else the cached choice, else the fastest of `candidates` (name → a builder that compiles and returns one call),
  `prefer` unless another is faster by MARGIN. ValueError naming the choices for a forced name that is not one."""
  asked = requested(forced)
  if asked in candidates:
    return Choice(asked, "forced")
  if len(candidates) == 1 and forced in (None, "auto"):  # $TAPERNORM_CPU_PATHS names a path of another target
    return Choice(next(iter(candidates)), "only")
  if asked != "auto":
    raise ValueError(f"{what}: the path {asked!r} is not available here; choose auto or one of "
                     f"{', '.join(candidates)}")
  path, names = cache_file(what, shape), list(candidates)
  cached = _read(path) or {}
  index = agreed(names.index(cached["name"]) if cached.get("name") in candidates else -1)
  if index >= 0:  # every process takes process 0's cached choice, or all of them time the candidates together
    return Choice(names[index], "cached", cached.get("seconds", {}), cached.get("measure_s", 0.0))
  choice = measure(what, label, candidates, prefer)
  choice = dataclasses.replace(choice, name=names[agreed(names.index(choice.name))])
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json_atomically(path, choice.record())
  except OSError as e:
    log.warning("could not cache the %s timing in %s (%s); it will be measured again next time", what, path, e)
  return choice


def agreed(index: int) -> int:
  """Process 0's `index` on every process of a multi-process run (one program everywhere), `index` otherwise."""
  if jax.process_count() == 1:
    return index
  from jax.experimental import multihost_utils  # noqa: PLC0415 (multi-process runs only)
  return int(multihost_utils.broadcast_one_to_all(np.int32(index)))


def _read(path: Path) -> dict[str, Any] | None:
  """A cached choice, or None (absent or unreadable: measured again)."""
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def measure(what: str, label: str, candidates: dict[str, Callable[[], Run]], prefer: str) -> Choice:
  """Builds every candidate, times them in ROUNDS alternated rounds and picks the fastest (`prefer` within MARGIN)."""
  t0 = time.perf_counter()
  log.warning("%s at %s: timing %d paths on this CPU (once for this host and shape): %s", what, label,
              len(candidates), ", ".join(candidates))
  runs = {name: build() for name, build in candidates.items()}  # compiling: most of the cost
  for run in runs.values():
    run()  # one untimed call each: first-call allocations are no candidate's speed
  samples: dict[str, list[float]] = {name: [] for name in runs}
  names = list(runs)
  for r in range(ROUNDS):
    for name in names[r % len(names):] + names[:r % len(names)]:  # each round starts with the next candidate
      samples[name].append(seconds_per_call(runs[name]))
    best = min(statistics.median(s) for s in samples.values())
    names = [name for name in names if name == prefer or statistics.median(samples[name]) < DROP * best]
  seconds = {name: statistics.median(s) for name, s in samples.items()}
  fastest = min(seconds, key=seconds.get)
  name = prefer if prefer in seconds and seconds[fastest] > (1 - MARGIN) * seconds[prefer] else fastest
  choice = Choice(name, "measured", seconds, time.perf_counter() - t0)
  log.warning("%s at %s: timed %d paths on this CPU in %.1f s, chose %s (cached for this host and shape; "
              "force one with a config field or $%s)", what, label, len(runs), choice.measure_s,
              choice.describe(), ENV)
  return choice


def seconds_per_call(run: Run) -> float:
  """Seconds per call of `run`, repeated until at least SAMPLE_S have passed."""
  calls, t0 = 0, time.perf_counter()
  while True:
    run()
    calls += 1
    elapsed = time.perf_counter() - t0
    if elapsed >= SAMPLE_S:
      return elapsed / calls

