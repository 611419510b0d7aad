"""The compile check's results as a markdown page: one row per program, the suggestions, what the numbers are."""

import os
from typing import Any

from tapernorm_jax.aot import traffic
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.storage.run_files import read_json, write_text_atomically

GIB = 2**30
TRAFFIC_TERMS = ("optimizer", "weights", "activations", "logits")  # traffic.Traffic's fields, as the report lists them
NOTE = (
  "Compiler figures and estimates, not measurements: memory, FLOPs, traffic and collectives are read from the "
  "TPU compiler's output for one chip; the time is a roofline estimate (the slowest of the products at peak "
  "bf16, device-memory traffic at HBM bandwidth and collectives at ICI/DCN bandwidth, the chip figures in "
  "`tapernorm_jax/aot/chips.py`); MFU is the analytic FLOPs over that time. Pallas kernels (splash attention) "
  "are invisible to the compiler's FLOP count."
)


def _giB(x: float | None) -> str:
  return "—" if x is None else f"{x / GIB:,.2f}"


def _count(x: float) -> str:
  """`1.23e+12` style for FLOPs."""
  return f"{x:.3g}" if x else "0"


def collectives_cell(collectives: dict[str, dict[str, float]]) -> str:
  """`all-gather ×48 (1.2 GiB ICI)` for each kind."""
  parts = []
  for kind, t in sorted(collectives.items()):
    links = [f"{t[key] / GIB:,.3g} GiB {name}" for key, name in (("ici_bytes", "ICI"), ("dcn_bytes", "DCN")) if t[key]]
    parts.append(f"{kind} ×{t['count']:,.0f}" + (f" ({', '.join(links)})" if links else ""))
  return "; ".join(parts) or "none"


def program_rows(results: dict[str, Any]) -> list[list[str]]:
  """One row per compiled program."""
  rows = []
  for p in results["programs"]:
    m, e = p["memory"], p["estimate"]
    ratio = f"{p['flops'] / p['analytic_flops']:.2f}" if p["analytic_flops"] and p["flops"] else "—"
    kernels = ", ".join(f"{name} ×{runs:,.0f}" for name, runs in sorted(p["kernels"].items())) or "—"
    rows.append(
      [
        p["program"],
        f"{p['compile_s']:.1f}",
        _giB(m.get("argument")),
        _giB(m.get("temp")),
        _giB(m["total"]),
        {True: "yes", False: "**no**", None: "—"}[p["fits"]],
        _count(p["flops"]),
        _count(p["analytic_flops"] or 0),
        ratio,
        collectives_cell(p["collectives"]),
        kernels,
        f"{e['step_s'] * 1e3:,.3g}" if e else "—",
        e["bound"] if e else "—",
        f"{e['mfu']:.0%}" if e and e["mfu"] is not None else "—",
      ]
    )
  return rows


HEADER = [
  "program",
  "compile s",
  "args GiB",
  "temps GiB",
  "total GiB",
  "fits",
  "FLOPs/chip (HLO)",
  "analytic FLOPs/chip",
  "HLO/analytic",
  "collectives per call (bytes each chip sends)",
  "kernels",
  "est. ms",
  "bound",
  "est. MFU",
]


def traffic_section(results: dict[str, Any]) -> list[str]:
  """The train steps' device-memory traffic, the compiler's count beside the independent one (`traffic.py`)."""
  steps = [p for p in results["programs"] if p["program"] in ("train_step", "fixed_step") and p["hbm_bytes"]]
  if not steps:
    return []
  count, chip = traffic.for_results(results), results["chip"]
  rows = []
  for p in steps:
    compute_s = p["estimate"]["compute_s"]
    floor_s = count.total / chip["hbm_bandwidth"]
    rows.append(
      [
        p["program"],
        _giB(p["hbm_bytes"]),
        f"{_giB(count.total)} ({', '.join(_giB(getattr(count, t)) for t in TRAFFIC_TERMS)})",
        f"{p['hbm_bytes'] / count.total:.2f}",
        f"{p['estimate']['memory_s'] * 1e3:,.3g}",
        f"{floor_s * 1e3:,.3g}",
        f"{compute_s * 1e3:,.3g}",
        "memory" if floor_s > compute_s else "compute",
      ]
    )
  header = [
    "program",
    "compiler's count GiB/chip",
    f"independent count GiB/chip ({', '.join(TRAFFIC_TERMS)})",
    "compiler/independent",
    "memory ms (compiler's)",
    "memory ms (independent)",
    "products ms",
    "bound by the independent count",
  ]
  return [
    "",
    "## Device-memory traffic: the compiler's count against an independent one",
    "",
    markdown_table(header, rows),
    "",
    "The estimate above uses the compiler's count: every top-level operation's operands and results as the TPU "
    "compiler built the program, an upper bound (it keeps some in on-chip memory). The independent count is what "
    "the optimizer, the weights, the activations and the logits must move with every elementwise operation fused "
    "(`tapernorm_jax/aot/traffic.py`), a floor. Where the compiler's count is several times the floor, the "
    "difference is in how the program was built, and only a TPU's profile says how much of it the chip moves.",
  ]


def markdown(results: dict[str, Any], command: str = "") -> str:
  """The results page: what was compiled, the table, the suggestions, and what the numbers are."""
  chip, run = results["chip"], results["run"]
  lines = [
    f"# Compile check: {run['variant']} {run['size']} on {results['slices']} × {results['topology']}",
    "",
    f"{results['chips']} × {chip['device_kind']} ({chip['name']}: {chip['hbm_bytes'] / GIB:.2f} GiB HBM, "
    f"{chip['peak_bf16_flops'] / 1e12:,.0f} TFLOP/s bf16), mesh data={results['mesh']['data']} × "
    f"fsdp={results['mesh']['fsdp']}; batch {run['batch_size']} × {run['model']['T']} tokens in "
    f"{run['microbatches']} microbatch(es); jax {results['versions']['jax']}, libtpu "
    f"{results['versions']['libtpu']}; {results['date']}.",
  ]
  if results.get("decoding"):
    d = results["decoding"]
    lines[-1] += f" Decoding: {d['batch']} rows, prompts of {d['prompt_len']} tokens, a cache of {run['model']['T']}"
    tensor = d.get("tensor", 1)
    lines[-1] += (
      f"; served split over {tensor} chips per copy (heads and MLP units; inference/tensor_parallel.py)."
      if tensor > 1
      else "; served whole on every chip."
    )
  if command:
    lines += ["", f"    {command}"]
  lines += ["", markdown_table(HEADER, program_rows(results)), "", NOTE]
  lines += traffic_section(results)
  if results.get("suggestions"):
    rows = [
      [
        s["flags"],
        {True: "yes", False: "no", None: "—"}[s["fits"]],
        _giB(s["need_bytes"]),
        "—" if s["step_s"] is None else f"{s['step_s'] * 1e3:,.3g}",
        s["bound"] or "—",
        "—" if s["mfu"] is None else f"{s['mfu']:.0%}",
      ]
      for s in results["suggestions"]
    ]
    lines += [
      "",
      "## Other splits and remat policies (train step), fastest that fit first",
      "",
      markdown_table(["overrides", "fits", "total GiB", "est. ms/step", "bound", "est. MFU"], rows),
    ]
  return "\n".join(lines)


def render(directory: str) -> str:
  """Rewrites `directory`/report.md from its results.json (the command it records kept); the page's path."""
  path = os.path.join(directory, "results.json")
  try:
    results = read_json(path)
  except ValueError as e:
    raise ValueError(
      f"--render={directory}: {path} is not JSON ({e}); give a compile check's --out directory"
    ) from None
  if results is None:
    raise ValueError(f"--render={directory}: cannot read {path} (no such file); give a compile check's --out directory")
  page_path = os.path.join(directory, "report.md")
  write_text_atomically(page_path, markdown(results, results.get("command", "")) + "\n")
  return page_path
