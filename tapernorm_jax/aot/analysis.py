"""One program compiled for a target: the compiler's memory figures, FLOPs, traffic, collectives and kernels, and a
roofline estimate of its time on a TPU chip (labelled an estimate: nothing is run).

The estimate takes the slowest of three resources, assuming the other two overlap with it: the products at the
chip's peak bf16 rate (the larger of the compiler's count and the analytic one, since a Pallas kernel's FLOPs are
invisible to the compiler), device-memory traffic at the HBM bandwidth, and the collectives' bytes at the ICI
bandwidth (DCN for groups that span slices). The chip figures are the table in `chips.py`.
"""

import dataclasses
import re
import time
from typing import Any

from tapernorm_jax.aot import hlo
from tapernorm_jax.aot.chips import Chip
from tapernorm_jax.aot.programs import Program

_OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "Ran out of memory", "exceeds available HBM")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclasses.dataclass
class Estimate:
  """Roofline times of one call (seconds) and what binds; MFU against the analytic FLOPs where there are some."""

  compute_s: float
  memory_s: float
  network_s: float | None  # None: the chip table has no figure for a network the program uses
  step_s: float
  bound: str
  mfu: float | None
  tokens_per_s: float | None


@dataclasses.dataclass
class Figures:
  """What the compiler says of one program on one chip (per-chip figures; `fits` None where no capacity is known)."""

  program: str
  compile_s: float
  memory: dict[str, float]
  fits: bool | None
  error: str = ""
  flops: float = 0.0  # XLA's cost analysis, plus the products of loop bodies' further trips
  xla_flops: float = 0.0  # XLA's cost analysis as it is (each loop body once)
  analytic_flops: float | None = None
  hbm_bytes: float = 0.0  # operands and results of every top-level operation, times its runs (`hlo.hbm_bytes`)
  collectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  kernels: dict[str, float] = dataclasses.field(default_factory=dict)
  unknown_loops: int = 0
  estimate: Estimate | None = None

  @property
  def need(self) -> float:
    """Bytes one chip holds while the program runs: arguments, outputs not aliased to them, temporaries, code."""
    return self.memory.get("total", 0.0)


def memory_figures(stats: Any) -> dict[str, float]:
  """The compiler's per-chip memory figures (bytes) and their total."""
  figures = {
    name: float(getattr(stats, f"{name}_size_in_bytes"))
    for name in ("argument", "output", "alias", "temp", "generated_code")
  }
  figures["total"] = (
    figures["argument"] + figures["output"] - figures["alias"] + figures["temp"] + figures["generated_code"]
  )
  return figures


def out_of_memory(error: Exception) -> dict[str, float] | None:
  """{"total": need, "capacity": HBM} from the TPU compiler's out-of-memory message, or None for any other error."""
  message = str(error)
  if not any(marker in message for marker in _OUT_OF_MEMORY):
    return None
  sizes = [float(n) * _UNITS[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([KMGT])i?B?(?!\w)", message)]
  need, capacity = sizes[:2] if len(sizes) >= 2 else (float("nan"), float("nan"))
  return {"total": need, "capacity": capacity}


def compile_program(program: Program, chip: Chip | None, device_slices: list[int]) -> Figures:
  """Lowers and compiles `program`; reads its figures. A program the TPU compiler refuses for lack of memory comes
  back with fits=False and the compiler's need and capacity; any other error propagates."""
  t0 = time.perf_counter()
  try:
    compiled = program.lower().compile()
  except Exception as e:  # noqa: BLE001 (only the compiler's out-of-memory refusal is a result; the rest re-raise)
    memory = out_of_memory(e)
    if memory is None:
      raise
    return Figures(
      program.name, time.perf_counter() - t0, memory, False, error=one_line(e), analytic_flops=program.analytic_flops
    )
  compile_s = time.perf_counter() - t0
  memory = memory_figures(compiled.memory_analysis())
  module = hlo.parse(compiled.as_text())
  counts = hlo.Counts.of(module)
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, list) else cost) or {}
  xla_flops = float(cost.get("flops", 0.0))  # each loop body once: the products of its further trips are added
  figures = Figures(
    program.name,
    compile_s,
    memory,
    None if chip is None else memory["total"] <= chip.hbm_bytes,
    flops=xla_flops + hlo.product_flops(module, counts.repeats()),
    xla_flops=xla_flops,
    analytic_flops=program.analytic_flops,
    hbm_bytes=hlo.hbm_bytes(module, counts, counts.runs),
    collectives=collective_totals(hlo.collectives(module, counts, device_slices)),
    kernels=hlo.custom_calls(module, counts),
    unknown_loops=counts.unknown_loops,
  )
  if chip is not None:
    figures.estimate = estimate(figures, chip, program.tokens)
  return figures


def collective_totals(found: list[hlo.Collective]) -> dict[str, dict[str, float]]:
  """Per kind: how many run per call, bytes each device sends over ICI and over DCN."""
  totals: dict[str, dict[str, float]] = {}
  for c in found:
    t = totals.setdefault(c.kind, {"count": 0.0, "ici_bytes": 0.0, "dcn_bytes": 0.0})
    t["count"] += c.runs
    t["dcn_bytes" if c.crosses_slices else "ici_bytes"] += c.runs * c.bytes_sent
  return totals


def estimate(figures: Figures, chip: Chip, tokens: int) -> Estimate:
  """The roofline estimate of one call on `chip` (see the module docstring)."""
  flops = max(figures.flops, figures.analytic_flops or 0.0)
  compute_s = flops / chip.peak_bf16_flops
  memory_s = figures.hbm_bytes / chip.hbm_bandwidth
  ici = sum(t["ici_bytes"] for t in figures.collectives.values())
  dcn = sum(t["dcn_bytes"] for t in figures.collectives.values())
  missing = (ici and chip.ici_bandwidth is None) or (dcn and chip.dcn_bandwidth is None)
  network_s = None if missing else ici / (chip.ici_bandwidth or 1) + dcn / (chip.dcn_bandwidth or 1)
  times = {"compute": compute_s, "memory": memory_s, "network": network_s or 0.0}
  bound = max(times, key=times.get)
  step_s = times[bound]
  mfu = figures.analytic_flops / (step_s * chip.peak_bf16_flops) if figures.analytic_flops and step_s else None
  return Estimate(compute_s, memory_s, network_s, step_s, bound, mfu, tokens / step_s if tokens and step_s else None)


def one_line(error: Exception) -> str:
  """The first line of an error's message."""
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:400]
