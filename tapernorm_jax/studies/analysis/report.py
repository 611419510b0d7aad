"""Study reports: report.md (status, setup, Table 2, the gaps, the scaling fits and the predictions made before the
largest size ran, decode throughput where measured, the logit and gradient norms, the figures), results.csv (one row
per run) and figures/*.png, written by `write_report` from a study directory."""

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath

from tapernorm_jax.storage import run_files, retries
from tapernorm_jax.storage.run_files import write_text_atomically
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.studies import manifest
from tapernorm_jax.studies.analysis import predict, scaling, throughput as throughput_lib, tuning
from tapernorm_jax.studies.analysis.aggregate import PAPER_TABLE2, Gap, Group, aggregate, control_of, gap, paper_setting
from tapernorm_jax.studies.analysis.curves import Curves, series, taper_start
from tapernorm_jax.studies.analysis.figures import figure_title, make_figures, save_png
from tapernorm_jax.studies.analysis.run_rows import (FINISHED, csv_text, NO_CONTEXT_MARGIN, Run, label, params_text,
                                            read_runs, size_order, unanchored, variant_order)


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
      reading = (f"against the baseline: {noise_words(vs_plain)}; against {label(control.variant, control.aux)}: "
                 f"{noise_words(vs_control)}")
    else:
      reading = "no matched control in this study: add baseline:aux=1 to the grid"
    rows.append([g.size, label(g.variant, g.aux), gap_text(vs_plain),
                 label(control.variant, control.aux) if control is not None else "—", gap_text(vs_control), reading])
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
      rows.append([size, label(*key), "unanchored" if unanchored(*key) else "anchored", len(runs), f"{s:,.1f}",
                   f"{e:,.1f}", f"{e / s:.2f}×", "?" if grad is None else f"{grad:.3g}",
                   f"{grad / base_grad:.2f}×" if grad and base_grad else "—"])
  if not rows:
    return ""
  return markdown_table(["size", "variant", "final scale", "n", "logit norm at taper start", "logit norm at end",
                         "growth", "grad norm, last 10%", "vs baseline"], rows)


def setup_lines(runs: Sequence[Run]) -> list[str]:
  """What the complete runs were: corpus, sizes with model shape and steps, batch, device."""
  done = [r for r in runs if r.status == "complete" and r.config]
  lines = []
  for size in sorted({r.size for r in done}, key=size_order):
    r = next(r for r in done if r.size == size)
    m, t = r.config.get("model", {}), r.config.get("train", {})
    lines.append(f"* `{size}`: L = {m.get('L')}, d = {m.get('D')}, V = {m.get('V')}, {params_text(r.params)} "
                 f"parameters; {t.get('steps')} steps of {t.get('batch_size')} × {m.get('T')} tokens, peak LR "
                 f"{r.config.get('opt', {}).get('lr')}, corpus `{r.corpus}`, trained on {r.device}")
  return lines


def status_lines(runs: Sequence[Run]) -> list[str]:
  """How many runs are complete, and which are failed, incomplete, never started or missing."""
  finished, unlearned = sum(r.status in FINISHED for r in runs), sum(r.status == "no_context" for r in runs)
  lines = [f"{finished} of {len(runs)} runs complete" + (f", {unlearned} of them learned no context." if unlearned
                                                         else ".")]
  for state, what in (("no_context", f"**Learned no context** (complete, but the validation loss is above the "
                                     f"unigram reference less {NO_CONTEXT_MARGIN} nats: in no mean, gap or fit)"),
                      ("failed", "Failed"), ("incomplete", "Incomplete"), ("pending", "Not started"),
                      ("missing", "Missing (in the sweep's grid, no run directory)")):
    bad = [r for r in runs if r.status == state]
    if state in ("no_context", "failed", "incomplete"):  # one entry per run, with its error
      items = [f"`{r.cell}`" + (f" ({r.error})" if r.error else "") for r in bad]
    else:  # one entry per size × variant, with its seeds
      seeds: dict[str, list[int]] = {}
      for r in bad:
        seeds.setdefault(f"{r.variant}-{r.size}-aux{r.aux}", []).append(r.seed)
      items = [f"`{name}` seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))}" for name, v in seeds.items()]
    if items:
      lines.append(f"{what}: " + "; ".join(items) + ".")
  return lines


def generated_at() -> str:
  """The report's time stamp, UTC: now, or SOURCE_DATE_EPOCH where set, so that two runs write the same bytes."""
  epoch = os.environ.get("SOURCE_DATE_EPOCH")
  if epoch is not None and not epoch.strip().isdigit():
    raise ValueError(f"SOURCE_DATE_EPOCH={epoch!r} is not a time: give whole seconds since 1970 (e.g. "
                     f"SOURCE_DATE_EPOCH=$(date +%s)) or unset it to stamp the report with the current time")
  return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(None if epoch is None else int(epoch)))


def report_markdown(workdir: str, runs: Sequence[Run], groups: Sequence[Group], figures: Sequence[str],
                    dynamics: str, throughput: dict[str, Any] | None = None,
                    fitted: Sequence[scaling.StudyFits] = (), predicted: dict[str, Any] | None = None) -> str:
  """report.md: status, setup, Table 2, the gaps, the fits and predictions, the inference forms' throughput, the
  dynamics table, the figures."""
  with_paper = paper_setting(runs)
  listed = manifest.read_manifest(workdir) or {}
  title = listed.get("name") or os.path.basename(os.path.abspath(workdir))
  parts = [f"# Study report: {title}", "",
           (f"Generated {generated_at()} by `python -m experiments.report` from the run directories "
            f"in `{os.path.basename(os.path.abspath(workdir))}/`; one row per run in `results.csv`."), "",
           "## Status", "", *status_lines(runs), "", "## Setup", "", *setup_lines(runs), "",
           "## Table 2 — validation loss at g = 0", "",
           "Mean ± sample standard deviation (ddof = 1) over the complete seeds, in nats/token, evaluated with the "
           "gate at 0; in brackets the gap to the baseline of the same size; n counts the seeds that finished "
           "(\"n = 2 of 3\": one is missing, failed or learned no context)."
           + (" Beside each cell: the paper's value (Kanavalau, Amo Alonso and Lall, arXiv 2602.10408, Table 2; "
              "6 seeds)." if with_paper else ""), "", table2_markdown(groups, with_paper), ""]
  if controls := controls_markdown(groups):
    parts += ["## Gaps against matched controls", "",
              ("Each tapered variant against the plain baseline (the paper's comparison) and against its matched "
               "control: the baseline trained with the same scale-loss setting, so that the gap measures the taper "
               "alone. Negative is a lower loss. ± is the standard error of the ratio R of the two means (the delta "
               "method, √(s₁²/n₁ + R²·s₂²/n₂) over the reference's mean) in %; a gap under two standard errors is "
               "inside the noise of this many seeds."), "", controls, ""]
  for study in fitted:
    if study.methods:
      parts += [f"## Scaling fits{f' (token budget {study.budget})' if study.budget else ''}", "",
                scaling.markdown(study), ""]
  if predicted:
    parts += [f"## Predicted before {predicted['size']} ran", "",
              (f"Written by `experiments.sweep --hold_out_largest` to `{predict.FILE}` before any run of "
               f"{predicted['size']} started: each method's loss there from its L(C) fitted on the smaller sizes, "
               f"at the compute its runs of {predicted['size']} were to spend (6·N + 12·L·D·T FLOPs per token); the "
               f"interval adds the seed noise of the mean to be measured to the bootstrap's spread of the law."
               + (f" In simulation it held the measured mean in {100 * predicted['coverage']['rate']:.0f}% of "
                  f"studies drawn from a known law (studies/coverage.json)." if predicted.get("coverage") else "")),
              "",
              predict.markdown(predicted, groups), ""]
  if throughput:
    parts += ["## Decode throughput of each method's inference form", "", throughput_lib.settings_text(throughput), "",
              throughput_lib.markdown(throughput), ""]
  if dynamics:
    parts += ["## Logit and gradient norms", "",
              ("Mean over seeds of the mean logit L2 norm at the taper start and at the last diagnostics step, and "
               "of the global gradient norm over the last 10% of steps (its ratio to the baseline's)."), "",
              dynamics, ""]
  for name in figures:
    parts += [f"## {figure_title(name)}", "", f"![{figure_title(name)}](figures/{name})", ""]
  return "\n".join(parts)


RECORDS = ("sweep.json", throughput_lib.FILE, predict.FILE, "results.json", "config.json", manifest.CELL_RECORD,
           "metrics.jsonl")  # what a report reads


def write_report(workdir: str, out: str | None = None) -> dict[str, Any]:
  """Reads the study in `workdir`; writes report.md, results.csv and figures/*.png to `out` (default: workdir).
  Either may be a URL (gs://...): the runs' records are read from local copies and the report uploaded."""
  out = out or workdir
  if not (run_files.is_url(workdir) or run_files.is_url(out)):
    return _write_report(os.path.abspath(os.path.expanduser(workdir)), os.path.abspath(os.path.expanduser(out)))
  with tempfile.TemporaryDirectory(prefix="tapernorm-report-") as tmp:
    local = workdir
    if run_files.is_url(workdir):  # named as the study is: the report's title and text name it
      local = os.path.join(tmp, "in", os.path.basename(workdir.rstrip("/")))
      copy_records(run_files.workdir_path(workdir), Path(local))
    written = _write_report(os.path.abspath(local), os.path.join(tmp, "out"))
    run_files.upload_tree(os.path.join(tmp, "out"), run_files.workdir_path(out))
    where = lambda path: str(run_files.workdir_path(out) / os.path.relpath(path, os.path.join(tmp, "out")))
    return {**written, "report": where(written["report"]), "csv": where(written["csv"]),
            "figures": [where(f) for f in written["figures"]]}


def copy_records(study: epath.Path, local: Path) -> None:
  """Copies the files a report reads (RECORDS) of the study directory `study` and of each run directory in it."""
  if not study.is_dir():
    raise ValueError(f"--workdir={study}: no such directory")
  for directory in (study, *(d for d in study.iterdir() if d.is_dir())):
    target = local / os.path.relpath(str(directory), str(study))
    for name in RECORDS:
      if (directory / name).exists():
        target.mkdir(parents=True, exist_ok=True)
        retries.copy(directory / name, epath.Path(target / name))


def _write_report(workdir: str, out: str) -> dict[str, Any]:
  """`write_report` on local directories."""
  generated_at()  # a bad SOURCE_DATE_EPOCH is named before any figure is drawn
  if not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir}: no such directory")
  if tuning.is_tuning_study(workdir):
    return tuning.write_tuning_report(workdir, out, f"Generated {generated_at()}")
  runs = read_runs(workdir)
  if not runs:
    raise ValueError(f"--workdir={workdir}: no run directories (results.json / config.json) and no sweep.json")
  groups = aggregate(runs)
  curves = Curves(runs)
  os.makedirs(os.path.join(out, "figures"), exist_ok=True)
  speed = throughput_lib.read(workdir)
  fitted = scaling.fits_by_budget(runs, groups)
  figures = make_figures(runs, groups, curves, speed, fitted)
  for name, fig in figures.items():
    save_png(fig, os.path.join(out, "figures", name))
  write_text_atomically(os.path.join(out, "results.csv"), csv_text(runs))
  text = report_markdown(workdir, runs, groups, list(figures), dynamics_markdown(curves), speed, fitted,
                         predict.read(workdir))
  write_text_atomically(os.path.join(out, "report.md"), text)
  return {"report": os.path.join(out, "report.md"), "csv": os.path.join(out, "results.csv"),
          "figures": [os.path.join(out, "figures", n) for n in figures], "runs": len(runs),
          "complete": sum(r.status in FINISHED for r in runs),
          "no_context": sum(r.status == "no_context" for r in runs)}
