"""The compile check's results as a markdown page: one row per program, the suggestions, what the numbers are."""

from typing import Any

from tapernorm_jax.markdown import markdown_table

GIB = 2**30
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
    lines[-1] += f" Decoding: {d['batch']} rows, prompts of {d['prompt_len']} tokens, a cache of {run['model']['T']}."
  if command:
    lines += ["", f"    {command}"]
  lines += ["", markdown_table(HEADER, program_rows(results)), "", NOTE]
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
