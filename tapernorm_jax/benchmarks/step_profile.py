"""Where a train step's time goes: a `jax.profiler` trace of a few steps, XLA's per-op times grouped by part.

Each op the trace records (an XLA:CPU thunk, or a GPU/TPU kernel with the same HLO name) is matched to
its HLO instruction in the compiled step, whose metadata names the JAX operation that made it
(`.../block_3/mlp/btd,df->btf/dot_general`, `transpose(jvp(...))` for the backward). `part` sorts
those names into the parts of a step; `profile` returns milliseconds per step for each, the step's
wall time, and how much of it no op was running (host work, dispatch and waiting). The step is warmed up until
three in a row run without page faults (the heap grows for a few steps), so that a trace times the steady state,
and the page faults of the traced steps are reported beside it.
"""

import collections
import gzip
import json
import re
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tapernorm_jax.benchmarks.pytorch import training
from tapernorm_jax.benchmarks import train as train_bench
from tapernorm_jax.markdown import markdown_table

PARTS = (
  "attention (scores, softmax, values)",
  "attention projections (qkv, out)",
  "MLP products",
  "MLP activations",
  "norms",
  "logits (head / tied embedding)",
  "loss (softmax cross-entropy)",
  "embedding lookup",
  "optimiser, clipping, metrics",
  "layout copies",
  "other",
)
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name="([^"]*)"')


def part(name: str, op: str) -> str:
  """The part of a train step an HLO instruction `name` made by JAX operation `op` belongs to."""
  if name.startswith(("copy", "transpose")):
    return "layout copies"
  if "Transformer.logits" in op:
    return "logits (head / tied embedding)"
  if "norm" in op:
    return "norms"
  if "/attn/" in op:  # the projections: einsums carrying their weight's axes (dthk, hkd), or cpu matrix products
    weights = "dot_general" in op and any(mark in op for mark in ("dthk", "hkd", "matrix_product"))
    return "attention projections (qkv, out)" if weights else "attention (scores, softmax, values)"
  if "/mlp/" in op:
    return "MLP products" if "dot_general" in op else "MLP activations"
  if "embed" in op:
    return "embedding lookup"
  if "jvp" not in op:
    return "optimiser, clipping, metrics"
  return "loss (softmax cross-entropy)" if "Transformer" not in op else "other"


def _events(directory: Path) -> list[dict]:
  """The complete ('X') events of the newest Perfetto trace under `directory`."""
  path = sorted(directory.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)[-1]
  trace = json.load(gzip.open(path))
  return [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace) if e.get("ph") == "X"]


def _busy_us(intervals: list[tuple[float, float]]) -> float:
  """Microseconds covered by the union of (start, end) intervals."""
  total, end = 0.0, float("-inf")
  for a, b in sorted(intervals):
    if b > end:
      total += b - max(a, end)
      end = b
  return total


def minor_faults() -> int:
  """Minor page faults of this process so far (each a fresh page the kernel mapped and zeroed)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def warm_up(call: Any, max_calls: int, steady: int = 3) -> int:
  """Calls `call()` until `steady` calls in a row make no page faults, at most `max_calls` times; returns how many
  calls ran (a single quiet call is not enough: a train step can fault again on the call after one that did not)."""
  quiet = 0
  for n in range(1, max_calls + 1):
    before = minor_faults()
    call()
    quiet = quiet + 1 if minor_faults() == before else 0
    if quiet == steady:
      return n
  return max_calls


def profile(step_fn: Any, state: Any, batch: Any, steps: int = 3, max_warmup: int = 12) -> dict[str, Any]:
  """Traces `steps` calls of the jitted `step_fn(state, batch) -> (state, metrics)`, warmed up until three steps in
  a row make no page faults (at most `max_warmup` steps): ms per step per part, forward and backward, the wall time per
  step, the share of it when no op ran, and the page faults per traced step."""
  step_fn = step_fn.lower(state, batch).compile()  # the executable the trace times, and its HLO's metadata
  ops = {m.group(1): m.group(2) for line in step_fn.as_text().splitlines() if (m := _INSTRUCTION.match(line))}
  box = [state]

  def step():
    box[0], _ = step_fn(box[0], batch)
    jax.block_until_ready(box[0])

  warmup_steps = warm_up(step, max_warmup)
  with tempfile.TemporaryDirectory(prefix="tapernorm-profile-") as directory:
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    t0, faults0 = time.perf_counter(), minor_faults()
    for _ in range(steps):
      step()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    faults_per_step = (minor_faults() - faults0) / steps
    jax.profiler.stop_trace()
    events = _events(Path(directory))
  parts: dict[str, float] = collections.Counter()
  intervals = []
  for e in events:
    if e["name"] in ops:
      direction = "backward" if "transpose(" in ops[e["name"]] else "forward"
      parts[(part(e["name"], ops[e["name"]]), direction)] += e.get("dur", 0) / 1e3 / steps
      intervals.append((e["ts"], e["ts"] + e.get("dur", 0)))
  idle_ms = max(wall_ms - _busy_us(intervals) / 1e3 / steps, 0.0)
  return {
    "wall_ms": wall_ms,
    "idle_ms": idle_ms,
    "ops_ms": sum(parts.values()),
    "warmup_steps": warmup_steps,
    "faults_per_step": faults_per_step,
    "parts": {f"{name} | {direction}": ms for (name, direction), ms in sorted(parts.items())},
  }


def markdown(profiles: dict[str, dict[str, Any]]) -> str:
  """One column per cell: ms per step of each part (forward + backward, and its share of all op time)."""
  cells = list(profiles)
  total = lambda p, name: sum(ms for key, ms in p["parts"].items() if key.split(" | ")[0] == name)
  rows = []
  for name in PARTS:
    values = [total(profiles[c], name) for c in cells]
    if any(v > 0.05 for v in values):
      rows.append([name, *(f"{v:,.0f} ({100 * v / profiles[c]['ops_ms']:.0f}%)" for v, c in zip(values, cells))])
  rows.append(
    ["**all ops** (two threads: may exceed the wall time)", *(f"{profiles[c]['ops_ms']:,.0f}" for c in cells)]
  )
  rows.append(["**step wall time**", *(f"{profiles[c]['wall_ms']:,.0f}" for c in cells)])
  rows.append(["no op running (host, dispatch, waits)", *(f"{profiles[c]['idle_ms']:,.0f}" for c in cells)])
  rows.append(
    [
      "page faults per step (after warm-up steps)",
      *(f"{profiles[c]['faults_per_step']:,.0f} (after {profiles[c]['warmup_steps']})" for c in cells),
    ]
  )
  return markdown_table(["part (ms per step)", *cells], rows)


def profile_cell(
  cell: str, variant: str = "baseline", steps: int = 3, seed: int = 0, cpu_paths: str = "auto"
) -> dict[str, Any]:
  """`profile` of one optimiser step of `variant` at a peer-benchmark cell (`SIZE:BxT`), mid-taper for TaperNorm,
  through the products and attention `cpu_paths` names (auto: what a run picks here; train/kernel_choice.py)."""
  size, B, T = training.parse_cell(cell)
  trainer = train_bench.make_trainer(variant, size, B, T, cpu_paths=cpu_paths)
  state = train_bench.mid_taper(trainer, trainer.init_state(seed))
  batch_BxT1 = np.random.default_rng(seed).integers(0, trainer.model_cfg.V, (B, T + 1), dtype=np.int32)
  result = profile(trainer.train_step, state, jax.device_put(batch_BxT1, trainer.batch_sharding), steps)
  return {"cell": cell, "variant": variant, "paths": trainer.paths_choice.record(), **result}
