"""The train-step benchmark's table against PyTorch: one row per cell and allocator, ratios round by round, notes on
each peer's form."""

from tapernorm_jax.benchmarks.pytorch import parity as parity
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.benchmarks.pytorch.training import LABELS, PEERS


def ratio_cell(row: dict, key: str) -> str:
  """`1.23× (1.10–1.31)`: the median and min–max over rounds of one round-by-round ratio, or `–`."""
  r = row["ratios"].get(key)
  return f"{r['median']:.2f}× ({r['min']:.2f}–{r['max']:.2f})" if r else "–"


def allocator_cell(row: dict) -> str:
  """The row's malloc setting, and why it did not hold where it did not."""
  effect = row["allocator_in_effect"]
  held = effect["setting"] == row["allocator"]  # the rows are named as the workers name their setting
  return row["allocator"] + ("" if held else f" (not in effect: {effect['keep_freed_memory']})")


def markdown(rows: list[dict], repeats: int, min_sample_s: float) -> str:
  """The train table: tokens/s per contender and allocator row, ours / HF round by round, TaperNorm / baseline, MFU;
  then the checks and what each peer contender ran."""
  tok = lambda x: f"{x['median']:,.0f}" if "median" in x else "n/a"
  table = [
    [
      r["size"],
      f"{r['B']} × {r['T']}",
      allocator_cell(r),
      *(tok(r["contenders"].get(n, {})) for n in LABELS),
      ratio_cell(r, "baseline/hf_eager"),
      ratio_cell(r, "baseline/hf_compiled"),
      ratio_cell(r, "taper/baseline"),
      ratio_cell(r, "library/baseline"),
      mfu_cell(r),
    ]
    for r in rows
  ]
  worst = lambda key, field: max((c[field] for r in rows for c in r[key].values() if field in c), default=0.0)
  dtype = rows[0]["dtypes"].get("hf_eager", {}).get("ours", {}) if rows else {}
  lines = [
    f"One optimiser step (forward, backward, global-norm clipping, AdamW), tokens/s, median of {repeats} "
    f"interleaved rounds of at least {min_sample_s:g} s per contender, each contender in its own process; "
    "ratios are per round (median and min–max over the rounds). Every cell runs twice: every process with "
    "glibc malloc's defaults (allocator: default), and every process with this project's "
    "(allocator.keep_freed_memory: one arena, no mmap, no trimming). Ours baseline runs in a process an entry "
    "point started (python -m experiments...); library-built is the same step in a process started as a "
    "user's script is (import tapernorm_jax, then a Trainer; benchmarks/pytorch/library_worker.py).",
    "",
    markdown_table(
      [
        "size",
        "B × T",
        "allocator",
        *LABELS.values(),
        "baseline / HF eager",
        "baseline / HF compiled",
        "all_taper / baseline",
        "library-built / baseline",
        "MFU (baseline)",
      ],
      table,
    ),
    "",
  ]
  if dtype:
    lines.append(
      f"Both sides in {dtype['param']} weights and {dtype['compute']} compute. First-step losses agree "
      f"within {worst('loss', 'relative_difference'):.1e} (relative); parameters after that step within "
      f"{worst('param_agreement', 'relative'):.1e} of each tensor's largest entry (the update itself: "
      f"{worst('param_agreement', 'update_relative_l2'):.1e}, relative L2)."
    )
  paths = {
    f"{r['size']} {LABELS[n]}": d["cpu_paths"]["name"]
    for r in rows
    for n, d in r.get("workers", {}).items()
    if "cpu_paths" in d
  }
  if paths:
    lines.append(
      "Our CPU paths (`train.cpu_paths=auto`, timed on this host): "
      + ", ".join(f"{k}: {v}" for k, v in paths.items())
      + "."
    )
  lines += [f"* {line}" for line in peer_notes(rows)]
  peak = next((r["peak"] for r in rows if r["peak"]), None)
  if peak:
    lines.append(f"MFU: 6·N + 12·L·D·T FLOPs per token against {peak['source']}.")
  return "\n".join(lines)


def peer_notes(rows: list[dict]) -> list[str]:
  """One line per peer contender: what it ran (compiled form, optimiser) or why it could not, each line once."""
  seen: dict[str, None] = {}
  for row in rows:
    for name in PEERS:
      first = row["first_step"].get(name, {})
      na = row["contenders"].get(name, {}).get("na")
      line = f"{LABELS[name]}: n/a ({na})" if na else f"{LABELS[name]}: {first.get('ran', '?')}"
      worker = row.get("workers", {}).get(name, {})
      if worker.get("cpu_capability") and worker.get("device") == "cpu":
        line += f"; ATen CPU capability {worker['cpu_capability']}"
        line += f", inductor {worker['inductor_isa']}" if name == "hf_compiled" and "inductor_isa" in worker else ""
      if "graphs" in first and not na:
        line += f"; {first['graphs']} graphs, split at: {'; '.join(first['graph_breaks']) or 'nothing'}"
      seen.setdefault(line, None)
  return list(seen)


def mfu_cell(row: dict) -> str:
  """The baseline's model FLOPs utilisation, or n/a."""
  mfu = row["contenders"].get("baseline", {}).get("mfu")
  return "n/a" if mfu is None else f"{100 * mfu:.1f}%"
