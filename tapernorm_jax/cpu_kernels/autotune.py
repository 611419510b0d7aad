"""Choosing between implementations of a hot path by timing them on this host, at this shape, once (cached).

A kernel tuned on one CPU can lose on another (the fused attention and matrix products were tuned on AVX-512 hosts and
cost a third of a 9M step on an AVX2-only one), so where the project has more than one implementation of a path,
`choose` builds each candidate, times them in alternated rounds (one compile and one untimed call per candidate, then
rounds of at least `SAMPLE_S` each, the far slower dropped after the first) until the ranking is clear or the budget
ends, logs what it measured, and keeps the fastest that is *clearly* the fastest. Clearly faster means every one of
its samples beat every sample of the other over at least `MIN_ROUNDS` alternated rounds, and its median by `MARGIN`;
candidates the fastest does not clearly beat are a tie, which the earliest in the preference order wins (the model's
own first, then the order offered). So noise decides nothing: two processes agree unless one path really is faster.
The result is cached like an autotuner's, one JSON file per host signature (CPU, cores, jax, the kernels' sources) and
shape under `$TAPERNORM_CACHE/autotune/`, so a host measures each shape once and again when any of those change.
"""

import dataclasses
import functools
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

from tapernorm_jax.storage import run_files
from tapernorm_jax.runtime import hardware
from tapernorm_jax.cpu_kernels import build

log = logging.getLogger(__name__)
MIN_ROUNDS = 5  # alternated rounds before a ranking may be called clear (5 each: two ties separate by chance 0.8%)
MAX_ROUNDS = 15  # ... and the most, within
BUDGET_S = 60.0  # seconds of timing (after compiling): a tie still unresolved then goes to the preference order
SAMPLE_S = 0.05  # a round times each candidate for at least this long (repeating fast calls)
DROP = 1.5  # after the first round, candidates this many times slower than the fastest are not timed again
MARGIN = 0.03  # ... and a candidate's median must beat another's by this share to be clearly faster
XLA, KERNELS = "xla", "kernels"  # the model's own products and attention; the CPU kernels that apply
ENV = "TAPERNORM_CPU_PATHS"  # what `auto` stands for in this process: `auto` (measure), or a path to force
Run = Callable[[], Any]  # one call of a candidate, returning only when its work is done


@dataclasses.dataclass(frozen=True)
class Choice:
  """The chosen candidate and how: `measured` here now, `cached` from an earlier measurement, `forced` by a config
  field or `$TAPERNORM_CPU_PATHS`, `only` (one candidate), or `untimed` (the preferred one, nothing timed yet); the
  measured median seconds per call of each."""

  name: str
  how: str
  seconds: dict[str, float] = dataclasses.field(default_factory=dict)
  measure_s: float = 0.0
  rounds: int = 0  # alternated rounds timed
  tied: tuple[str, ...] = ()  # the candidates the fastest did not clearly beat (the choice is the first by preference)

  def record(self) -> dict[str, Any]:
    """As results.json and the benchmark tables record it."""
    return {**dataclasses.asdict(self), "tied": list(self.tied)}

  def describe(self) -> str:
    """`xla (measured: xla 0.281 s, kernels 0.412 s)`."""
    times = ", ".join(f"{name} {s:.3g} s" for name, s in sorted(self.seconds.items(), key=lambda kv: kv[1]))
    tie = f"; not clearly apart: {', '.join(self.tied)}" if len(self.tied) > 1 else ""
    return f"{self.name} ({self.how}{': ' + times if times else ''}{tie})"


def host_signature() -> dict[str, Any]:
  """What a timing depends on besides the shape: the CPU model and its flags (as the kernels' builds key them), the
  cores this process may use, jax and jaxlib, XLA's flags, the kernels' sources and -march, and the devices."""
  return {
    "cpu": hashlib.sha256(build.cpu_id().encode()).hexdigest()[:12],
    "cores": hardware.usable_cores(),
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "devices": jax.device_count(),
    "kernels": kernels_digest(),
    "kernel_march": build.MARCH,
  }


@functools.cache
def kernels_digest() -> str:
  """A hash of the kernels' sources (this package's C++ and Python files): an edited kernel is timed again."""
  digest = hashlib.sha256()
  for source in sorted(Path(__file__).parent.glob("*.[cp][cy]")):  # *.cc and *.py
    digest.update(source.name.encode() + source.read_bytes())
  return digest.hexdigest()[:12]


def cache_file(what: str, shape: dict[str, Any]) -> Path:
  """The cached choice of `what` at `shape` on this host."""
  key = json.dumps({"what": what, "shape": shape, "host": host_signature()}, sort_keys=True, default=str)
  return Path(run_files.cache_dir()) / "autotune" / f"{what}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def requested(forced: str | None) -> str:
  """The path asked for: `forced` unless it is auto (or None), then `$TAPERNORM_CPU_PATHS` (default auto)."""
  return forced if forced not in (None, "auto") else os.environ.get(ENV, "auto") or "auto"


def choose(
  what: str,
  label: str,
  shape: dict[str, Any],
  candidates: dict[str, Callable[[], Run]],
  prefer: str,
  forced: str | None = "auto",
  measure: bool = True,
) -> Choice:
  """The candidate for `what` at `shape` (`label` in the log): `forced` (or `$TAPERNORM_CPU_PATHS`) when not auto,
  else the cached choice, else the clearly fastest of `candidates` (name → a builder that compiles and returns one
  call; `measure`'s rule), or with `measure` False `prefer`, untimed. ValueError naming the choices for a forced name
  that is not one."""
  asked = requested(forced)
  if asked in candidates:
    return Choice(asked, "forced")
  if len(candidates) == 1 and forced in (None, "auto"):  # $TAPERNORM_CPU_PATHS names a path of another target
    return Choice(next(iter(candidates)), "only")
  if asked != "auto":
    raise ValueError(f"{what}: the path {asked!r} is not available here; choose auto or one of {', '.join(candidates)}")
  path, names = cache_file(what, shape), list(candidates)
  cached = _read(path) or {}
  index = agreed(names.index(cached["name"]) if cached.get("name") in candidates else -1)
  if index >= 0:  # every process takes process 0's cached choice, or all of them time the candidates together
    return Choice(
      names[index],
      "cached",
      cached.get("seconds", {}),
      cached.get("measure_s", 0.0),
      cached.get("rounds", 0),
      tuple(cached.get("tied", ())),
    )
  if not measure:
    return Choice(prefer, "untimed")
  choice = timed(what, label, candidates, prefer)
  choice = dataclasses.replace(choice, name=names[agreed(names.index(choice.name))])
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    run_files.write_json_atomically(path, choice.record())
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


def timed(what: str, label: str, candidates: dict[str, Callable[[], Run]], prefer: str) -> Choice:
  """Builds every candidate and times them in alternated rounds until the fastest clearly beats the rest (at least
  MIN_ROUNDS, at most MAX_ROUNDS or BUDGET_S); the choice is `decide`'s."""
  t0 = time.perf_counter()
  log.warning(
    "%s at %s: timing %d paths on this CPU (once for this host and shape): %s",
    what,
    label,
    len(candidates),
    ", ".join(candidates),
  )
  runs = {name: build() for name, build in candidates.items()}  # compiling: most of the cost
  for run in runs.values():
    run()  # one untimed call each: first-call allocations are no candidate's speed
  samples: dict[str, list[float]] = {name: [] for name in runs}
  names, t_timing, rounds = list(runs), time.perf_counter(), 0
  while True:
    for name in names[rounds % len(names) :] + names[: rounds % len(names)]:  # each round starts with the next one
      samples[name].append(seconds_per_call(runs[name]))
    rounds += 1
    best = min(statistics.median(samples[name]) for name in names)
    names = [name for name in names if name == prefer or statistics.median(samples[name]) < DROP * best]
    tied = ties({name: samples[name] for name in names})
    if rounds >= MIN_ROUNDS and (len(tied) == 1 or rounds >= MAX_ROUNDS or time.perf_counter() - t_timing >= BUDGET_S):
      break
  order = [prefer, *(name for name in runs if name != prefer)]
  choice = Choice(
    min(tied, key=order.index),
    "measured",
    {name: statistics.median(s) for name, s in samples.items()},
    time.perf_counter() - t0,
    rounds,
    tuple(sorted(tied, key=order.index)),
  )
  log.warning(
    "%s at %s: timed %d paths on this CPU in %.1f s (%d rounds), chose %s (cached for this host and shape; "
    "force one with a config field or $%s)",
    what,
    label,
    len(runs),
    choice.measure_s,
    rounds,
    choice.describe(),
    ENV,
  )
  return choice


def clearly_faster(a: list[float], b: list[float]) -> bool:
  """Whether samples `a` beat `b` beyond noise: every one faster than every one of `b`, the median by MARGIN."""
  return max(a) < min(b) and statistics.median(a) < (1 - MARGIN) * statistics.median(b)


def ties(samples: dict[str, list[float]]) -> list[str]:
  """The fastest candidate (by median) and every one it does not clearly beat."""
  fastest = min(samples, key=lambda name: statistics.median(samples[name]))
  return [name for name in samples if name == fastest or not clearly_faster(samples[fastest], samples[name])]


def seconds_per_call(run: Run) -> float:
  """Seconds per call of `run`, repeated until at least SAMPLE_S have passed."""
  calls, t0 = 0, time.perf_counter()
  while True:
    run()
    calls += 1
    elapsed = time.perf_counter() - t0
    if elapsed >= SAMPLE_S:
      return elapsed / calls
