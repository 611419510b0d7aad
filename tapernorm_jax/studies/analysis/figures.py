"""The study's figures: Figure 2 (validation loss against parameters), each method's decode throughput, Figure 3
(logit norm, anchored vs unanchored), Figure 4 (gradient norm by weight type), and the training loss of baseline vs
internal_taper with the gate; drawn without pyplot, saved as palette PNGs."""

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
import numpy as np

from tapernorm_jax.studies.analysis import fits
from tapernorm_jax.studies.analysis.aggregate import Group
from tapernorm_jax.studies.analysis.curves import Curves, mean_curve, series
from tapernorm_jax.studies.analysis.run_rows import (
  Run,
  budgets,
  label,
  params_text,
  size_order,
  split_size,
  unanchored,
  variant_order,
)
from tapernorm_jax.studies.analysis.scaling import StudyFits
from tapernorm_jax.studies.analysis.plotting import (
  log_y,
  mark_taper,
  method_style,
  new_figure,
  size_panels,
  smoothing_window,
)

WEIGHT_TYPES = (("qkv", "QKV"), ("attn_out", "attention out"), ("mlp_in", "MLP in"), ("mlp_out", "MLP out"))
FIGURES = {  # file name → (title in report.md, caption)
  "fig2_val_loss_vs_params.png": "Figure 2 — validation loss against parameter count",
  "decode_throughput.png": "Decode throughput against size, each method in its inference form",
  "fits_gap_vs_params.png": "The gap against size, with its fitted law",
  "fits_loss_vs_compute.png": "Loss against training compute, with each method's fitted law",
  "fig3_logit_norm.png": "Figure 3 — mean logit L2 norm, anchored vs unanchored",
  "fig4_grad_norm.png": "Figure 4 — gradient norm by weight type",
  "train_loss_gate.png": "Training loss, baseline vs internal_taper (+aux), with the gate",
}


def figure_scaling(groups: Sequence[Group]) -> Figure | None:
  """Figure 2: final val loss (g = 0) against parameter count, log x, a line per variant with std error bars.

  Each size sits at its baseline's parameter count (variants differ by a few γ̃ vectors), the variants
  spread slightly sideways so that their error bars stay apart.
  """
  done = [g for g in groups if (g.n or g.no_context) and g.params]
  keys = sorted({(g.variant, g.aux) for g in done}, key=variant_order)
  if not keys:
    return None
  sizes = sorted({split_size(g.size)[0] for g in done}, key=size_order)
  study_budgets = budgets(g.size for g in done)
  params_at = lambda s, key=None: [
    g.params for g in done if split_size(g.size)[0] == s and (key is None or (g.variant, g.aux) == key)
  ]
  at = {s: float(next(iter(params_at(s, ("baseline", 0))), np.median(params_at(s)))) for s in sizes}
  fig = new_figure(7.0, 4.6)
  ax = fig.add_subplot()
  for i, key in enumerate(keys):
    shift = 1.0 + 0.025 * (i - (len(keys) - 1) / 2)
    for j, budget in enumerate(study_budgets):  # one line per token budget, told apart by its marker
      line = [
        g
        for g in sorted(done, key=lambda g: size_order(g.size))
        if (g.variant, g.aux) == key and split_size(g.size)[1] == budget
      ]
      name = label(*key) + (f", budget {budget}" if budget else "")
      pts = [(at[split_size(g.size)[0]] * shift, g.mean, g.std or 0.0) for g in line if g.n]
      if pts:
        x, y, err = (np.asarray(v, float) for v in zip(*pts))
        ax.errorbar(
          x,
          y,
          yerr=err,
          marker="osD^v<>"[j % 7],
          markersize=4,
          capsize=3,
          linewidth=1.5,
          label=name,
          **method_style(key),
        )
      unlearned = [(at[split_size(g.size)[0]] * shift, loss) for g in line for loss in g.no_context]
      if unlearned:  # seeds outside the mean, each shown where it ended
        ax.plot(
          *zip(*unlearned),
          linestyle="none",
          marker="x",
          markersize=7,
          color=method_style(key).get("color"),
          label=f"{name}: learned no context (not in the mean)",
        )
  ax.set_xscale("log")
  ax.set_xticks([at[s] for s in sizes], [f"{s}\n{params_text(int(at[s]))}" for s in sizes])
  ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
  lo, hi = min(at.values()), max(at.values())
  ax.set_xlim(lo / 1.4, hi * 1.4)
  ax.set_xlabel("parameters (log scale)")
  ax.set_ylabel("validation loss at g = 0 (nats/token)")
  ax.set_title(
    "Validation loss vs model size (mean ± std over seeds)"
    + ("\n× a seed that learned no context" if any(g.no_context for g in done) else "")
  )
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def figure_throughput(result: dict[str, Any] | None) -> Figure | None:
  """Decode tokens/s of each method's inference form against parameters (log-log), and its ratio to the baseline
  with the min–max over rounds (throughput.py)."""
  rows = (result or {}).get("rows") or []
  if not rows:
    return None
  fig = new_figure(11.0, 4.4)
  speed_ax, ratio_ax = fig.subplots(1, 2)
  keys = sorted({(r["variant"], r["aux"]) for r in rows}, key=variant_order)
  for i, key in enumerate(keys):
    mine = sorted((r for r in rows if (r["variant"], r["aux"]) == key), key=lambda r: r["params"])
    x = np.asarray([r["params"] for r in mine], float) * (1.0 + 0.02 * (i - (len(keys) - 1) / 2))
    speed_ax.plot(
      x,
      [r["tokens_s"]["median"] for r in mine],
      marker="o",
      markersize=4,
      linewidth=1.5,
      label=f"{label(*key)} [{mine[0]['form']}]",
      **method_style(key),
    )
    rated = [(xi, r["vs_baseline"]) for xi, r in zip(x, mine) if r["vs_baseline"]]
    if rated:
      xs, ratios = zip(*rated)
      mid = np.asarray([q["median"] for q in ratios])
      err = np.asarray([[m - q["min"] for m, q in zip(mid, ratios)], [q["max"] - m for m, q in zip(mid, ratios)]])
      ratio_ax.errorbar(xs, mid, yerr=err, marker="o", markersize=4, capsize=3, linewidth=1.2, **method_style(key))
  ratio_ax.axhline(1.0, color="#888888", linewidth=0.8)
  for ax in (speed_ax, ratio_ax):
    ax.set_xscale("log")
    ax.set_xlabel("parameters (log scale)")
    ax.grid(True, which="both", alpha=0.3)
  speed_ax.set_yscale("log")
  speed_ax.set_ylabel("decode throughput (tokens/s, log scale)")
  speed_ax.set_title("Tokens/s of the inference form")
  ratio_ax.set_ylabel("× the baseline's tokens/s (same rounds)")
  ratio_ax.set_title("Against the baseline (median, min–max over rounds)")
  speed_ax.legend(fontsize=7)
  s = result["settings"]
  fig.suptitle(
    f"Decode throughput, batch {s['batch']}, {s['new_tokens']} tokens after a {s['prompt']}-token prompt, "
    f"on {result['hardware']['cpu']}",
    fontsize=10,
  )
  fig.tight_layout()
  return fig


def figure_gap_fits(study: StudyFits | None) -> Figure | None:
  """Each method's gap against its matched control (the baseline where it has none) against parameters, log-log
  (symmetric-log where a gap is negative): seeds' means ± standard error, the fitted ΔL(N) and its bootstrap band."""
  fitted = [
    (m, m.vs_control or m.vs_baseline, m.control if m.vs_control else ("baseline", 0))
    for m in (study.methods if study else [])
  ]
  if not fitted:
    return None
  fig = new_figure(7.5, 4.8)
  ax = fig.add_subplot()
  lowest = np.inf
  for m, fit, reference in fitted:
    n = np.asarray(fit.params)
    grid = np.geomspace(n.min(), n.max(), 50)
    line, low, high = (100 * y for y in fit.curve(grid))
    style = method_style(m.key)
    ax.fill_between(grid, low, high, color=style["color"], alpha=0.12, linewidth=0)
    ax.plot(grid, line, linewidth=1.4, **style)
    ax.errorbar(
      n,
      100 * np.asarray(fit.gaps),
      yerr=100 * np.asarray(fit.errors),
      fmt="o",
      markersize=4,
      capsize=3,
      color=style["color"],
      label=f"{label(*m.key)} − {label(*reference)}: b = {fit.b.text('{:.2f}')}",
    )
    lowest = min(lowest, float(np.min(np.concatenate([100 * np.asarray(fit.gaps), low]))))
  ax.set_xscale("log")
  if lowest > 0:
    log_y(ax)
    ax.set_ylabel("gap in validation loss (%, log scale)")
  else:
    ax.set_yscale("symlog", linthresh=0.1)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.axhline(0.0, color="#888888", linewidth=0.8)
    ax.set_ylabel("gap in validation loss (%, symmetric log: linear within ±0.1%)")
  ax.set_xlabel("parameters (log scale)")
  ax.set_title(
    f"Gap against size, fitted ΔL(N) = a·N^(−b) with its {fits.LEVEL:.0%} bootstrap band"
    + (f"\n(token budget {study.budget})" if study.budget else "")
  )
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def figure_compute_fits(study: StudyFits | None) -> Figure | None:
  """Validation loss against training compute per method, log-log: seeds' mean ± std and the fitted L(C)."""
  laws = (
    [(("baseline", 0), study.baseline_law)] + [(m.key, m.law) for m in study.methods if m.law]
    if study and study.baseline_law
    else []
  )
  if not laws:
    return None
  fig = new_figure(7.5, 4.8)
  ax = fig.add_subplot()
  for key, law in laws:
    c = np.asarray(law.compute)
    grid = np.geomspace(c.min(), c.max(), 50)
    style = method_style(key)
    ax.plot(grid, law.curve(grid), linewidth=1.4, **style)
    ax.plot(
      c, law.losses, "o", markersize=4, color=style["color"], label=f"{label(*key)}: α = {law.alpha.text('{:.2f}')}"
    )
  ax.set_xscale("log")
  log_y(ax)
  ax.set_xlabel("training compute (FLOPs, log scale)")
  ax.set_ylabel("validation loss at g = 0 (nats/token, log scale)")
  ax.set_title(
    "Loss against compute, fitted L(C) = E + A·C^(−α) per method"
    + (f"\n(token budget {study.budget})" if study.budget else "")
  )
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def figure_logit_norm(curves: Curves) -> Figure | None:
  """Figure 3: mean logit L2 norm against step (log y), a panel per size; seeds thin, mean thick; taper start."""
  sizes = [s for s in curves.sizes() if any(curves.curves(rs, "logit_norm") for rs in curves.by_key(s).values())]
  if not sizes:
    return None
  fig, axes = size_panels(len(sizes), 5.2)
  for ax, size in zip(axes, sizes):
    groups = curves.by_key(size)
    for key, runs in groups.items():
      seeds = curves.curves(runs, "logit_norm")
      if not seeds:
        continue
      for steps, values in seeds:
        ax.plot(steps, values, linewidth=0.7, alpha=0.35, **method_style(key))
      steps, mean = mean_curve(seeds)
      tag = "unanchored" if unanchored(*key) else "anchored"
      ax.plot(steps, mean, linewidth=2.2, label=f"{label(*key)} — {tag}", **method_style(key))
    mark_taper(ax, [r for rs in groups.values() for r in rs])
    log_y(ax)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean logit L2 norm (log scale)")
    params = next((r.params for rs in groups.values() for r in rs if r.params), None)
    ax.set_title(f"{size} ({params_text(params)} params)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Logit norm: anchored (solid) vs unanchored (dashed); thin lines are seeds, thick the mean")
  fig.tight_layout()
  return fig


def figure_grad_norm(curves: Curves, size: str | None = None) -> Figure | None:
  """Figure 4: gradient norm by weight type against step (log y), mean over seeds per variant, one size."""
  if size is None:
    with_unanchored = [s for s in curves.sizes() if any(unanchored(*k) for k in curves.by_key(s))]
    size = (with_unanchored or curves.sizes() or [None])[-1]
  if size is None:
    return None
  groups = curves.by_key(size)
  window = smoothing_window(curves, size)
  fig = new_figure(11, 7.4)
  axes = fig.subplots(2, 2, sharex=True).ravel()
  plotted = False
  for ax, (wkey, title) in zip(axes, WEIGHT_TYPES):
    for key, runs in groups.items():
      seeds = curves.curves(runs, f"grad_norm/{wkey}", window)
      if not seeds:
        continue
      steps, mean = mean_curve(seeds)
      lo = np.min([np.interp(steps, s, v) for s, v in seeds], axis=0)
      hi = np.max([np.interp(steps, s, v) for s, v in seeds], axis=0)
      ax.fill_between(steps, lo, hi, alpha=0.15, color=method_style(key)["color"], linewidth=0)
      ax.plot(steps, mean, linewidth=1.6, label=label(*key), **method_style(key))
      plotted = True
    mark_taper(ax, [r for rs in groups.values() for r in rs])
    log_y(ax)
    ax.set_title(f"{title} weights")
    ax.set_ylabel("gradient L2 norm (log scale)")
    ax.grid(True, which="both", alpha=0.3)
  if not plotted:
    return None
  for ax in axes[2:]:
    ax.set_xlabel("training step")
  axes[0].legend(fontsize=7)
  params = next((r.params for rs in groups.values() for r in rs if r.params), None)
  fig.suptitle(
    f"Gradient norm by weight type, {size} ({params_text(params)} params); unanchored dashed\n"
    f"mean over seeds (band: min–max over seeds), moving average over {window} steps"
  )
  fig.tight_layout()
  return fig


def figure_train_loss(curves: Curves) -> Figure | None:
  """Training loss of baseline vs internal_taper (+aux), mean over seeds, a panel per size; gate on a twin axis."""
  pair = (("baseline", 0), ("internal_taper", 1))
  sizes = [s for s in curves.sizes() if all(k in curves.by_key(s) for k in pair)]
  if not sizes:
    return None
  fig, axes = size_panels(len(sizes), 5.4)
  for ax, size in zip(axes, sizes):
    groups = curves.by_key(size)
    window = smoothing_window(curves, size)
    tail_lo, tail_hi = np.inf, -np.inf
    for key in pair:
      steps, mean = mean_curve(curves.curves(groups[key], "loss", window))
      ax.plot(steps, mean, linewidth=1.6, label=f"{label(*key)} (mean of {len(groups[key])})", **method_style(key))
      late = mean[len(mean) // 10 :]
      tail_lo, tail_hi = min(tail_lo, late.min()), max(tail_hi, late.max())
    if np.isfinite(tail_lo):
      pad = 0.05 * (tail_hi - tail_lo + 1e-9)
      ax.set_ylim(tail_lo - pad, tail_hi + pad)
    ax.set_xlabel("training step")
    ax.set_ylabel(f"training loss (nats/token, moving average over {window})")
    ax.grid(True, alpha=0.3)
    gate_ax = ax.twinx()
    gate_steps, gate = series(curves.records[groups[pair[1]][0].cell], "gate")
    gate_ax.plot(gate_steps, gate, color="#888888", linestyle=":", linewidth=1.4, label="gate g (internal_taper)")
    gate_ax.set_ylim(-0.02, 1.05)
    gate_ax.set_ylabel("gate g")
    handles = ax.get_legend_handles_labels()
    gate_handles = gate_ax.get_legend_handles_labels()
    ax.legend(handles[0] + gate_handles[0], handles[1] + gate_handles[1], fontsize=7, loc="upper right")
    params = next((r.params for rs in groups.values() for r in rs if r.params), None)
    ax.set_title(f"{size} ({params_text(params)} params)")
  fig.suptitle("Training loss, baseline vs internal_taper (+aux); y axis from 10% of training on")
  fig.tight_layout()
  return fig


def make_figures(
  runs: Sequence[Run],
  groups: Sequence[Group],
  curves: Curves | None = None,
  throughput: dict[str, Any] | None = None,
  studies: Sequence[StudyFits] = (),
) -> dict[str, Figure]:
  """Every figure the runs (the study's throughput.json and scaling fits, if any) have data for, by file name; the
  fits' figures once per token budget (`fits_gap_vs_params@tpp20.png`)."""
  curves = curves or Curves(runs)
  figures = {
    "fig2_val_loss_vs_params.png": figure_scaling(groups),
    "decode_throughput.png": figure_throughput(throughput),
  }
  for study in studies:
    at = f"@{study.budget}" if study.budget else ""
    figures |= {
      f"fits_gap_vs_params{at}.png": figure_gap_fits(study),
      f"fits_loss_vs_compute{at}.png": figure_compute_fits(study),
    }
  figures |= {
    "fig3_logit_norm.png": figure_logit_norm(curves),
    "fig4_grad_norm.png": figure_grad_norm(curves),
    "train_loss_gate.png": figure_train_loss(curves),
  }
  return {name: fig for name, fig in figures.items() if fig is not None}


def figure_title(name: str) -> str:
  """The report's heading for a figure file: FIGURES's, with the token budget where the name has one."""
  base, _, budget = name.removesuffix(".png").partition("@")
  return FIGURES[f"{base}.png"] + (f" (token budget {budget})" if budget else "")
