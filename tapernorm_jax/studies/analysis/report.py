"""Study reports: report.md (status, setup, Table 2, the gaps, the scaling fits and the predictions made before the
largest size ran, decode throughput where measured, the logit and gradient norms, the figures), results.csv (one row
per run) and figures/*.png, written by `write_report` from a study directory."""

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etils import epath

from tapernorm_jax.storage import run_files, retries
from tapernorm_jax.storage.run_files import write_text_atomically
from tapernorm_jax.studies import manifest
from tapernorm_jax.studies.analysis import predict, scaling, throughput as throughput_lib, tuning
from tapernorm_jax.studies.analysis.aggregate import Group, aggregate, paper_setting
from tapernorm_jax.studies.analysis.curves import Curves
from tapernorm_jax.studies.analysis.figures import figure_title, make_figures
from tapernorm_jax.studies.analysis.plotting import save_png
from tapernorm_jax.studies.analysis.run_rows import (
  FINISHED,
  csv_text,
  NO_CONTEXT_MARGIN,
  Run,
  params_text,
  read_runs,
  size_order,
)
from tapernorm_jax.studies.analysis.tables import (
  controls_markdown,
  dynamics_markdown,
  settings_markdown,
  table2_markdown,
)


def setup_lines(runs: Sequence[Run]) -> list[str]:
  """What the complete runs were: corpus, sizes with model shape and steps, batch, device."""
  done = [r for r in runs if r.status == "complete" and r.config]
  lines = []
  for size in sorted({r.size for r in done}, key=size_order):
    r = next(r for r in done if r.size == size)
    m, t = r.config.get("model", {}), r.config.get("train", {})
    lrs = {q.config.get("opt", {}).get("lr") for q in done if q.size == size}
    devices = sorted({q.device for q in done if q.size == size})
    lr = f"peak LR {lrs.pop()}" if len(lrs) == 1 else "peak LR per method"
    lines.append(
      f"* `{size}`: L = {m.get('L')}, d = {m.get('D')}, V = {m.get('V')}, {params_text(r.params)} "
      f"parameters; {t.get('steps')} steps of {t.get('batch_size')} × {m.get('T')} tokens, {lr}, "
      f"corpus `{r.corpus}`, trained on {' and '.join(devices)}"
    )
  return lines


def status_lines(runs: Sequence[Run]) -> list[str]:
  """How many runs are complete, and which are failed, incomplete, never started or missing."""
  finished, unlearned = sum(r.status in FINISHED for r in runs), sum(r.status == "no_context" for r in runs)
  lines = [
    f"{finished} of {len(runs)} runs complete" + (f", {unlearned} of them learned no context." if unlearned else ".")
  ]
  for state, what in (
    (
      "no_context",
      f"**Learned no context** (complete, but the validation loss is above the "
      f"unigram reference less {NO_CONTEXT_MARGIN} nats: in no mean, gap or fit)",
    ),
    ("failed", "Failed"),
    ("incomplete", "Incomplete"),
    ("pending", "Not started"),
    ("missing", "Missing (in the sweep's grid, no run directory)"),
  ):
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
    raise ValueError(
      f"SOURCE_DATE_EPOCH={epoch!r} is not a time: give whole seconds since 1970 (e.g. "
      f"SOURCE_DATE_EPOCH=$(date +%s)) or unset it to stamp the report with the current time"
    )
  return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(None if epoch is None else int(epoch)))


def report_markdown(
  workdir: str,
  runs: Sequence[Run],
  groups: Sequence[Group],
  figures: Sequence[str],
  dynamics: str,
  throughput: dict[str, Any] | None = None,
  fitted: Sequence[scaling.StudyFits] = (),
  predicted: dict[str, Any] | None = None,
) -> str:
  """report.md: status, setup, Table 2, the gaps, the fits and predictions, the inference forms' throughput, the
  dynamics table, the figures."""
  with_paper = paper_setting(runs)
  listed = manifest.read_manifest(workdir) or {}
  title = listed.get("name") or os.path.basename(os.path.abspath(workdir))
  parts = [
    f"# Study report: {title}",
    "",
    (
      f"Generated {generated_at()} by `python -m experiments.report` from the run directories "
      f"in `{os.path.basename(os.path.abspath(workdir))}/`; one row per run in `results.csv`."
    ),
    "",
    "## Status",
    "",
    *status_lines(runs),
    "",
    "## Setup",
    "",
    *setup_lines(runs),
    "",
    "## Table 2 — validation loss at g = 0",
    "",
    "Mean ± sample standard deviation (ddof = 1) over the complete seeds, in nats/token, evaluated with the "
    "gate at 0; in brackets the gap to the baseline of the same size; n counts the seeds that finished "
    "(\"n = 2 of 3\": one is missing, failed or learned no context)."
    + (
      " Beside each cell: the paper's value (Kanavalau, Amo Alonso and Lall, arXiv 2602.10408, Table 2; 6 seeds)."
      if with_paper
      else ""
    ),
    "",
    table2_markdown(groups, with_paper),
    "",
  ]
  if settings := settings_markdown(runs):
    parts += [
      "## Each method's setting",
      "",
      (
        "The tuned preset each method trained at (`tapernorm_jax/train/tuned.json`, chosen by a tuning study on its "
        "tune split; `defaults` where none was chosen) and its peak LR, per size."
      ),
      "",
      settings,
      "",
    ]
  if controls := controls_markdown(groups):
    parts += [
      "## Gaps against matched controls",
      "",
      (
        "Each tapered variant against the plain baseline (the paper's comparison) and against its matched "
        "control: the baseline trained with the same scale-loss setting, so that the gap measures the taper "
        "alone. Negative is a lower loss. ± is the standard error of the ratio R of the two means (the delta "
        "method, √(s₁²/n₁ + R²·s₂²/n₂) over the reference's mean) in %; a gap under two standard errors is "
        "inside the noise of this many seeds."
      ),
      "",
      controls,
      "",
    ]
  for study in fitted:
    if study.methods:
      parts += [
        f"## Scaling fits{f' (token budget {study.budget})' if study.budget else ''}",
        "",
        scaling.markdown(study),
        "",
      ]
  if predicted:
    parts += [
      f"## Predicted before {predicted['size']} ran",
      "",
      (
        f"Written by `experiments.sweep --hold_out_largest` to `{predict.FILE}` before any run of "
        f"{predicted['size']} started: each method's loss there from its L(C) fitted on the smaller sizes, "
        f"at the compute its runs of {predicted['size']} were to spend (6·N + 12·L·D·T FLOPs per token); the "
        f"interval adds the seed noise of the mean to be measured to the bootstrap's spread of the law."
        + (
          f" In simulation it held the measured mean in {100 * predicted['coverage']['rate']:.0f}% of "
          f"studies drawn from a known law (tapernorm_jax/studies/analysis/coverage.json)."
          if predicted.get("coverage")
          else ""
        )
      ),
      "",
      predict.markdown(predicted, groups),
      "",
    ]
  if throughput:
    parts += [
      "## Decode throughput of each method's inference form",
      "",
      throughput_lib.settings_text(throughput),
      "",
      throughput_lib.markdown(throughput),
      "",
    ]
  if dynamics:
    parts += [
      "## Logit and gradient norms",
      "",
      (
        "Mean over seeds of the mean logit L2 norm at the taper start and at the last diagnostics step, and "
        "of the global gradient norm over the last 10% of steps (its ratio to the baseline's)."
      ),
      "",
      dynamics,
      "",
    ]
  for name in figures:
    parts += [f"## {figure_title(name)}", "", f"![{figure_title(name)}](figures/{name})", ""]
  return "\n".join(parts)


RECORDS = (
  "sweep.json",
  throughput_lib.FILE,
  predict.FILE,
  "results.json",
  "config.json",
  manifest.CELL_RECORD,
  "metrics.jsonl",
)  # what a report reads


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
    return {
      **written,
      "report": where(written["report"]),
      "csv": where(written["csv"]),
      "figures": [where(f) for f in written["figures"]],
    }


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
  text = report_markdown(
    workdir, runs, groups, list(figures), dynamics_markdown(curves), speed, fitted, predict.read(workdir)
  )
  write_text_atomically(os.path.join(out, "report.md"), text)
  return {
    "report": os.path.join(out, "report.md"),
    "csv": os.path.join(out, "results.csv"),
    "figures": [os.path.join(out, "figures", n) for n in figures],
    "runs": len(runs),
    "complete": sum(r.status in FINISHED for r in runs),
    "no_context": sum(r.status == "no_context" for r in runs),
  }
