"""The inference benchmark's tables: forward and decode rows as markdown, beside the paper's numbers."""

from tapernorm_jax.runtime import hardware
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.model.norms import POINTWISE_MODES
from tapernorm_jax.benchmarks.decode import FULL, PAPER_TABLE, ROWWISE, WITHOUT_KERNEL, speedup


def pointwise_forms(rows: list[dict]) -> list[str]:
  """The point-wise norms a table's rows timed (none in results from before they were)."""
  return [mode for mode in POINTWISE_MODES if mode in rows[0]["forms"]]


def decode_table(results: dict) -> list[str]:
  """The decode roofline table's lines: tokens/s per form and batch, the CPU projection's gain, the rooflines."""
  dram = lambda B, step: B * results["bandwidth"]["median_gb_s"] * 1e9 / (step["weights"] + step["cache"])
  rows, extra = [], pointwise_forms(results["decode"])
  for row in results["decode"]:
    f = row["forms"]
    cell = lambda n: f"{f[n]['median']:,.1f} ({speedup(f, n, 'baseline')['median']:.3f}×)"
    step = f["folded"]["bytes_per_step"]
    kernel = speedup(f, "folded", WITHOUT_KERNEL) if WITHOUT_KERNEL in f else None
    per_row = (
      f" / per row {f[ROWWISE]['median']:,.1f} ({speedup(f, 'folded', ROWWISE)['median']:.2f}×)" if ROWWISE in f else ""
    )
    rows.append(
      [
        row["B"],
        row["prompt"],
        row["new_tokens"],
        f"{f['baseline']['median']:,.1f}",
        cell("fixed"),
        cell("folded"),
        cell("identity"),
        *map(cell, extra),
        f"{f[WITHOUT_KERNEL]['median']:,.1f} ({kernel['median']:.2f}× {kernel['min']:.2f}–{kernel['max']:.2f}){per_row}"
        if kernel
        else f"– ({row.get('projection', '')})",
        f"{(step['weights'] + step['cache']) / 1e6:.1f}",
        f"{row['read_gb_s']['median']:.1f}",
        f"{f['folded']['roofline_tokens_s']:,.1f}",
        f"{100 * f['folded']['roofline_fraction']:.0f}%",
        f"{100 * f['folded']['median'] / dram(row['B'], step):.0f}%",
      ]
    )
  return [
    "KV-cache decode after a P-token prompt (prefill excluded), tokens/s (ratio to baseline; every form "
    "with the CPU few-row projection that `cpu_kernels/few_rows.py` picks for the batch, and "
    "folded once more with the model's own einsum). "
    "Roofline = B × read bandwidth ÷ bytes read per step (weights + KV cache), with the bandwidth of a "
    "sum over as many bytes as one step reads (sampled between the decode runs), and with the DRAM "
    "bandwidth:",
    "",
    markdown_table(
      [
        "B",
        "P",
        "N",
        "baseline",
        "fixed",
        "folded",
        "identity",
        *extra,
        "folded, model's einsum (CPU projection's gain, range) / one product per row",
        "MB read / step",
        "read GB/s",
        "roofline tok/s",
        "folded % of roofline",
        "folded % of DRAM roofline",
      ],
      rows,
    ),
    "",
  ]


def markdown(results: dict) -> str:
  """The forward table laid out like the paper's (k tokens/s, ratio to baseline), and the decode roofline table."""
  s = results["settings"]
  lines = [
    f"Measured {results['date']} on {hardware.one_line(results['hardware'])}, "
    f"{s['size']} {s['variant']} model ({results['params']:,} parameters), {s['dtype']}, "
    f"median of {s['repeats']} interleaved runs (± half the min–max spread); ratios are the median over those "
    f"rounds of each round's ratio, which cancels load drifts slower than a round. "
    f"DRAM read bandwidth (jitted sum over {results['bandwidth']['bytes'] / 2**30:.0f} GiB): "
    f"{results['bandwidth']['median_gb_s']:.1f} GB/s.",
    "",
  ]
  if results.get("forward"):
    rows, extra = [], pointwise_forms(results["forward"])
    for row in results["forward"]:
      f = row["forms"]
      cell = lambda n: (
        f"{f[n]['median'] / 1e3:.2f} ± {50 * f[n]['spread']:.1f}% ({speedup(f, n, 'baseline')['median']:.3f}×)"
      )
      paper = PAPER_TABLE.get((row["B"], row["T"]))
      bound = speedup(f, "folded", "identity")
      rows.append(
        [
          row["B"],
          row["T"],
          f"{f['baseline']['median'] / 1e3:.2f} ± {50 * f['baseline']['spread']:.1f}%",
          cell(FULL) if FULL in f else "–",
          cell("fixed"),
          cell("folded"),
          cell("identity"),
          *map(cell, extra),
          f"{bound['median']:.3f} ({bound['min']:.2f}–{bound['max']:.2f})",
          f"{paper[2]:.1f} ({paper[2] / paper[0]:.2f}×)" if paper else "–",
        ]
      )
    lines += [
      "Last-token-logits forward, no KV cache, thousands of tokens/s (ratio to baseline). Every form runs "
      "its last block on the last position only, the one whose logits are asked for: fewer FLOPs than a "
      "forward over every position (the paper's, and Hugging Face's with `logits_to_keep=1`); the second "
      "column is the baseline with every block on every position, the work such a forward does:",
      "",
      markdown_table(
        [
          "B",
          "T",
          "baseline",
          "baseline, every block on every position",
          "fixed",
          "folded",
          "identity",
          *extra,
          "folded / identity",
          "paper folded (H100)",
        ],
        rows,
      ),
      "",
    ]
  if results.get("decode"):
    lines += decode_table(results)
  return "\n".join(lines)
