"""A study's decode throughput as the report reads it: DIR/throughput.json (written by
`benchmarks/study_throughput.py`, which times it) and its table. Imports nothing of jax."""

import os
from typing import Any

from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.storage.run_files import read_json
from tapernorm_jax.studies.analysis.run_rows import Key, label, params_text, size_order, variant_order

FILE = "throughput.json"
REFERENCE: Key = ("baseline", 0)


def read(workdir: str) -> dict[str, Any] | None:
  """DIR/throughput.json, or None where the study has none."""
  return read_json(os.path.join(workdir, FILE))


def markdown(result: dict[str, Any]) -> str:
  """One row per method, a column per size: decode tokens/s of its inference form and its ratio to the baseline."""
  rows = result["rows"]
  sizes = sorted({r["size"] for r in rows}, key=size_order)
  keys = sorted({(r["variant"], r["aux"]) for r in rows}, key=variant_order)
  at = {(r["size"], r["variant"], r["aux"]): r for r in rows}
  params = {}  # a size's parameter count: its baseline's (the methods differ by a few vectors)
  for r in sorted(rows, key=lambda r: (r["variant"], r["aux"]) != REFERENCE):
    params.setdefault(r["size"], r["params"])

  def cell(row: dict[str, Any] | None) -> str:
    if row is None:
      return "—"
    ratio = row["vs_baseline"]
    spread = f" ({ratio['min']:.2f}–{ratio['max']:.2f})" if ratio else ""
    return f"{row['tokens_s']['median']:,.0f}" + (f" · {ratio['median']:.2f}×{spread}" if ratio else "")

  forms_of = {key: next(r["form"] for r in rows if (r["variant"], r["aux"]) == key) for key in keys}
  body = [[label(*key), forms_of[key], *(cell(at.get((size, *key))) for size in sizes)] for key in keys]
  head = ["method", "inference form", *(f"{size} ({params_text(params[size])})" for size in sizes)]
  return markdown_table(head, body)


def settings_text(result: dict[str, Any]) -> str:
  """How the throughput was measured, in one sentence."""
  s, hw = result["settings"], result["hardware"]
  return (
    f"KV-cache decoding of {s['new_tokens']} tokens after a {s['prompt']}-token prompt, batch {s['batch']}, "
    f"tokens/s (median of {s['repeats']} rounds alternated over the methods of each size) · the per-round "
    f"ratio to the baseline (median, min–max); each method's lowest complete seed, on {hw['cpu']} "
    f"({hw['cpu_count']} cores, {hw['backend']}, jax {hw['jax']}). Re-measure with "
    f"`python -m experiments.report --workdir=DIR --throughput`."
  )
