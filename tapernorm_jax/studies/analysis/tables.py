"""The report's tables: Table 2 over seeds (beside the paper's numbers in its setting), the gaps against matched
controls, the training dynamics, and each method's tuned setting."""

from collections.abc import Sequence
import numpy as np
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.studies.analysis.aggregate import PAPER_TABLE2, Gap, Group, control_of, gap
from tapernorm_jax.studies.analysis.curves import Curves, series, taper_start
from tapernorm_jax.studies.analysis.run_rows import (
  Run,
  label,
  params_text,
  size_order,
  unanchored,
  variant_order,
)


def loss_text(mean: float, std: float | None, gap: float | None) -> str:
  """`2.1852 ± 0.0040 (+1.46%)`."""
  text = f"{mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")
  return text + (f" ({gap:+.2f}%)" if gap is not None else "")


def table2_markdown(groups: Sequence[Group], with_paper: bool = False) -> str:
  """Table 2: a row per size, a column per variant; `mean ± std (gap to baseline) · n seeds` (and the paper's)."""
  keys = sorted({(g.variant, g.aux) for g in groups}, key=variant_order)
  sizes = sorted({g.size for g in groups}, key=size_order)
  by = {(g.size, g.variant, g.aux): g for g in groups}
  rows = []
  for size in sizes:
    params = next((g.params for g in groups if g.size == size and g.params), None)
    row: list[str] = [size, params_text(params)]
    for variant, aux in keys:
      g = by.get((size, variant, aux))
      if g is None:
        row.append("—")
        continue
      seeds = f"n = {g.n}" + (f" of {g.expected}" if g.expected != g.n else "")
      seeds += f" (**{len(g.no_context)} learned no context**)" if g.no_context else ""
      text = (loss_text(g.mean, g.std, g.gap_pct) if g.n else "no complete run") + f" · {seeds}"
      paper = PAPER_TABLE2.get((size, variant, aux))
      if with_paper and paper:
        ref = PAPER_TABLE2.get((size, "baseline", 0))
        gap = None if (variant, aux) == ("baseline", 0) else 100 * (paper[0] - ref[0]) / ref[0]
        text += f"<br>paper: {loss_text(paper[0], paper[1], gap)}"
      row.append(text)
    rows.append(row)
  return markdown_table(["size", "params", *(label(*k) for k in keys)], rows)


def gap_text(g: Gap | None) -> str:
  """`-2.90% ± 0.62%` (the standard error of the difference), or — without a complete seed on both sides."""
  if g is None:
    return "—"
  return f"{g.pct:+.2f}%" + (f" ± {g.se_pct:.2f}%" if g.se_pct is not None else "")


def noise_words(g: Gap | None) -> str:
  """`inside the noise`, `lower, 3.1 standard errors`, or why it cannot be told."""
  if g is None or g.inside_noise is None:
    return "too few seeds to tell"
  if g.inside_noise:
    return "inside the noise"
  return f"{'lower' if g.pct < 0 else 'higher'}, {abs(g.pct) / g.se_pct:.1f} standard errors"


def controls_markdown(groups: Sequence[Group]) -> str:
  """Each tapered group against the plain baseline and against its matched control, with a reading in words."""
  plain = {g.size: g for g in groups if (g.variant, g.aux) == ("baseline", 0)}
  rows = []
  for g in groups:
    if g.variant == "baseline":
      continue
    control, vs_plain = control_of(g, groups), gap(g, plain[g.size]) if g.size in plain else None
    vs_control = gap(g, control) if control is not None else None
    if control is not None and control.aux == 0:
      reading = f"against the baseline, its matched control: {noise_words(vs_plain)}"
    elif control is not None:
      reading = (
        f"against the baseline: {noise_words(vs_plain)}; against {label(control.variant, control.aux)}: "
        f"{noise_words(vs_control)}"
      )
    else:
      reading = "no matched control in this study: add baseline:aux=1 to the grid"
    rows.append(
      [
        g.size,
        label(g.variant, g.aux),
        gap_text(vs_plain),
        label(control.variant, control.aux) if control is not None else "—",
        gap_text(vs_control),
        reading,
      ]
    )
  if not rows:
    return ""
  return markdown_table(["size", "variant", "vs baseline", "matched control", "vs matched control", "reading"], rows)


def dynamics_markdown(curves: Curves) -> str:
  """Logit norm at the taper start and at the end, and the last-10% gradient norm, per size × variant."""
  rows = []
  for size in curves.sizes():
    groups = curves.by_key(size)
    base_grad = None
    for key, runs in groups.items():
      starts, ends, grads = [], [], []
      for r in runs:
        steps, norms = series(curves.records[r.cell], "logit_norm")
        start = taper_start(r.config)
        if len(steps) and start is not None:
          starts.append(float(np.interp(start, steps, norms)))
          ends.append(float(norms[-1]))
        gsteps, g = series(curves.records[r.cell], "grad_norm")
        if len(g):
          grads.append(float(np.mean(g[gsteps >= 0.9 * gsteps[-1]])))
      grad = float(np.mean(grads)) if grads else None
      if key == ("baseline", 0):
        base_grad = grad
      if not starts:
        continue
      s, e = float(np.mean(starts)), float(np.mean(ends))
      rows.append(
        [
          size,
          label(*key),
          "unanchored" if unanchored(*key) else "anchored",
          len(runs),
          f"{s:,.1f}",
          f"{e:,.1f}",
          f"{e / s:.2f}×",
          "?" if grad is None else f"{grad:.3g}",
          f"{grad / base_grad:.2f}×" if grad and base_grad else "—",
        ]
      )
  if not rows:
    return ""
  return markdown_table(
    [
      "size",
      "variant",
      "final scale",
      "n",
      "logit norm at taper start",
      "logit norm at end",
      "growth",
      "grad norm, last 10%",
      "vs baseline",
    ],
    rows,
  )


def settings_markdown(runs: Sequence[Run]) -> str:
  """Per method and size, the tuned preset its runs trained at (`tuned` in their config) and their peak LR; "" when no
  run was tuned."""
  done = [r for r in runs if r.status in ("complete", "no_context") and r.config]
  if not any(r.config.get("tuned") for r in done):
    return ""
  sizes = sorted({r.size for r in done}, key=size_order)
  cells: dict[tuple, dict[str, str]] = {}
  for r in done:
    tag, lr = r.config.get("tuned") or "defaults", r.config.get("opt", {}).get("lr")
    cells.setdefault(r.key, {})[r.size] = f"{tag} (LR {lr:g})" if lr is not None else tag
  rows = [[label(*key)] + [cells[key].get(size, "—") for size in sizes] for key in sorted(cells, key=variant_order)]
  return markdown_table(["method", *sizes], rows)
