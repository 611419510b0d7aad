"""Study reports on run directories built here: exact aggregates, missing and failed cells, the CSV, the figures."""

import csv
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tapernorm_jax.storage import integrity
from tapernorm_jax.studies import manifest, spec
from tapernorm_jax.studies.analysis import aggregate, curves, figures, report, run_rows, tables
from locations import ROOT

STEPS = 40
# (size, variant, aux) → final val loss per seed; None: the seed failed. Seed 2 of all_taper-1m is in the grid only.
LOSSES = {
  ("1m", "baseline", 0): [2.0, 2.2, 2.4],
  ("1m", "internal_taper", 1): [2.2, 2.4, None],
  ("1m", "all_taper", 0): [2.5, 2.7],
  ("3m", "baseline", 0): [1.5, 1.7, 1.6],
  ("3m", "internal_taper", 1): [1.6, 1.8, 1.7],
}
PARAMS = {"1m": 1_035_000, "3m": 2_854_000}


def write_run(workdir: str, size: str, variant: str, aux: int, seed: int, loss: float | None) -> str:
  """A run directory as the loop leaves it (config.json, metrics.jsonl, results.json) or as a failed cell."""
  cell = spec.Cell(variant, size, aux, seed)
  run_dir = os.path.join(workdir, cell.name)
  os.makedirs(run_dir)
  config = {
    "variant": variant,
    "size": size,
    "seed": seed,
    "model": {"L": 8, "D": 64, "T": 512, "V": 10_000},
    "taper": {"scale_loss_weight": 0.1 * aux, "gate_warmup_frac": 0.25},
    "train": {"steps": STEPS, "batch_size": 16},
    "opt": {"lr": 3e-4},
  }
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    json.dump(config, f)
  growth = 1.08 if run_rows.unanchored(variant, aux) else 1.0
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    for step in range(STEPS if loss is not None else 12):
      record = {
        "step": step,
        "loss": 5.0 - step / 10,
        "gate": max(0.0, 1 - step / STEPS),
        "grad_norm": 1.0,
        "tokens_per_s": 1000.0 + step,
        **{f"grad_norm/{w}": 0.5 + seed for w, _ in figures.WEIGHT_TYPES},
      }
      if step % 5 == 4:
        record.update(logit_norm=10.0 * growth**step, val_loss=4.0)
      f.write(integrity.checked_line(record))
  if loss is None:
    with open(os.path.join(run_dir, manifest.CELL_RECORD), "w") as f:
      json.dump({**cell.to_json(), "status": "failed", "error": "FloatingPointError: loss is nan at step 11"}, f)
    return run_dir
  with open(os.path.join(run_dir, "results.json"), "w") as f:
    json.dump(
      {
        "variant": variant,
        "size": size,
        "seed": seed,
        "corpus": "tinystories",
        "scale_loss_weight": 0.1 * aux,
        "steps": STEPS,
        "tokens": STEPS * 16 * 512,
        "final_val_loss": loss,
        "val_gate": 0.0,
        "params": PARAMS[size] + 64 * aux,
        "wall_time_s": 10.0,
        "devices": 1,
        "backend": "cpu",
        "complete": True,
      },
      f,
    )
  return run_dir


@pytest.fixture
def study(tmp_path):
  """The study above, with a manifest naming one cell that has no directory."""
  workdir = str(tmp_path / "study")
  cells = []
  for (size, variant, aux), losses in LOSSES.items():
    for seed, loss in enumerate(losses):
      write_run(workdir, size, variant, aux, seed, loss)
      cells.append(spec.Cell(variant, size, aux, seed))
  cells.append(spec.Cell("all_taper", "1m", 0, 2))  # in the grid, never run
  manifest.write_manifest(workdir, {"name": "test"}, cells)
  return workdir


def test_a_study_is_read_and_reported_where_jax_cannot_be_imported(study, tmp_path):
  """Reading a study (rows, fits, figures, the report) needs no jax: jax, flax and optax are made unimportable."""
  script = (
    "import sys\nfor name in ('jax', 'jaxlib', 'flax', 'optax'):\n  sys.modules[name] = None\n"
    "from tapernorm_jax.studies.analysis import report\n"
    "print(sorted(report.write_report(sys.argv[1], sys.argv[2])))"
  )
  done = subprocess.run(
    [sys.executable, "-c", script, study, str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert os.path.isfile(tmp_path / "out" / "report.md") and os.path.isfile(tmp_path / "out" / "results.csv")


def test_aggregates_are_exact_and_count_missing_and_failed_seeds(study):
  runs = run_rows.read_runs(study)
  assert len(runs) == 15
  states = {r.cell: r.status for r in runs}
  assert states["internal_taper-1m-aux1-seed2"] == "failed"
  assert states["all_taper-1m-aux0-seed2"] == "missing"
  groups = {(g.size, g.variant, g.aux): g for g in aggregate.aggregate(runs)}
  base = groups[("1m", "baseline", 0)]
  assert (base.n, base.expected) == (3, 3)
  assert base.mean == pytest.approx(2.2) and base.std == pytest.approx(0.2) and base.gap_pct is None
  it = groups[("1m", "internal_taper", 1)]
  assert (it.n, it.expected) == (2, 3) and it.losses == [2.2, 2.4]
  assert it.mean == pytest.approx(2.3) and it.std == pytest.approx(math.sqrt(0.02))
  assert it.gap_pct == pytest.approx(100 * 0.1 / 2.2)
  unanchored = groups[("1m", "all_taper", 0)]
  assert (unanchored.n, unanchored.expected) == (2, 3) and unanchored.gap_pct == pytest.approx(100 * 0.4 / 2.2)
  assert groups[("3m", "internal_taper", 1)].gap_pct == pytest.approx(100 * 0.1 / 1.6)
  assert [(g.size, g.variant) for g in aggregate.aggregate(runs)][:3] == [
    ("1m", "baseline"),
    ("1m", "internal_taper"),
    ("1m", "all_taper"),
  ]


def test_gaps_against_matched_controls_say_what_is_inside_the_noise():
  G = aggregate.Group
  base, control = G("3m", "baseline", 0, [1.5, 1.7, 1.6], 3), G("3m", "baseline", 1, [1.50, 1.51, 1.52], 3)
  tapered, one_seed = G("3m", "internal_taper", 1, [1.6, 1.8, 1.7], 3), G("3m", "all_taper", 0, [1.7], 1)
  alone = G("1m", "all_taper", 1, [2.0, 2.1], 2)
  groups = [base, control, tapered, one_seed, alone]
  vs_control = aggregate.gap(tapered, control)  # the delta method's standard error of the ratio, in %
  assert vs_control.pct == pytest.approx(100 * (1.7 - 1.51) / 1.51)
  assert vs_control.se_pct == pytest.approx(100 * math.sqrt(0.1**2 / 3 + (1.7 / 1.51) ** 2 * 0.01**2 / 3) / 1.51)
  assert vs_control.inside_noise is False and aggregate.gap(tapered, base).inside_noise is True  # 6.25% < 2 × 5.26%
  assert aggregate.control_of(one_seed, groups) is base and aggregate.control_of(base, groups) is None
  assert aggregate.gap(one_seed, base).se_pct is None and aggregate.control_of(alone, groups) is None
  rows = tables.controls_markdown(groups).splitlines()[2:]
  assert rows == [
    "| 3m | internal_taper (+aux) | +6.25% ± 5.26% | baseline (+aux) | +12.58% ± 3.85% | against the baseline: "
    "inside the noise; against baseline (+aux): higher, 3.3 standard errors |",
    "| 3m | all_taper (aux=0) | +6.25% | baseline | +6.25% | against the baseline, its matched control: too few "
    "seeds to tell |",
    "| 1m | all_taper (+aux) | — | — | — | no matched control in this study: add baseline:aux=1 to the grid |",
  ]


def test_table2_markdown_names_seeds_and_the_paper_only_in_its_setting(study):
  runs = run_rows.read_runs(study)
  table = tables.table2_markdown(aggregate.aggregate(runs), with_paper=True)
  lines = table.splitlines()
  assert lines[0] == "| size | params | baseline | internal_taper (+aux) | all_taper (aux=0) |"
  assert "2.2000 ± 0.2000 · n = 3<br>paper: 2.1538 ± 0.0025" in lines[2]
  assert "2.3000 ± 0.1414 (+4.55%) · n = 2 of 3<br>paper: 2.1852 ± 0.0040 (+1.46%)" in lines[2]
  assert lines[3].endswith("| — |")  # no unanchored run at 3m
  assert not aggregate.paper_setting(runs)  # 40 steps is not the paper's run length
  text = report.report_markdown(study, runs, aggregate.aggregate(runs), [], "")
  assert "`internal_taper-1m-aux1-seed2` (FloatingPointError: loss is nan at step 11)" in text
  assert "## Gaps against matched controls" in text and "| 3m | internal_taper (+aux) | +6.25% ± 5.26% |" in text
  assert "Missing (in the sweep's grid, no run directory): `all_taper-1m-aux0` seed 2." in text


def test_the_time_stamp_is_source_date_epoch_where_set_and_a_bad_one_is_named(study, monkeypatch, tmp_path):
  monkeypatch.setenv("SOURCE_DATE_EPOCH", str(86_400 * 365 + 3_600 + 120))  # 1971-01-01 01:02 UTC
  runs = run_rows.read_runs(study)
  text = report.report_markdown(study, runs, aggregate.aggregate(runs), [], "")
  assert "Generated 1971-01-01 01:02 UTC by `python -m experiments.report`" in text
  monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
  with pytest.raises(ValueError, match="SOURCE_DATE_EPOCH='yesterday' is not a time") as raised:
    report.write_report(study, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists(), raised  # named before anything is written


def test_the_paper_column_appears_only_in_the_paper_setting():
  def run(steps: int, corpus: str = "tinystories") -> run_rows.Run:
    return run_rows.Run(
      "baseline-1m-aux0-seed0",
      "baseline",
      0,
      "1m",
      0,
      "complete",
      steps=steps,
      corpus=corpus,
      final_val_loss=2.15,
      params=PARAMS["1m"],
    )

  assert aggregate.paper_setting([run(500_000)])
  assert not aggregate.paper_setting([run(500_000, "synthetic-stories(seed=0,train=20000,valid=1000)")])
  assert not aggregate.paper_setting([run(500_000), run(1000)])
  text = report.report_markdown("/tmp/x", [run(500_000)], aggregate.aggregate([run(500_000)]), [], "")
  assert "| 1m | 1.03M | 2.1500 · n = 1<br>paper: 2.1538 ± 0.0025 |" in text and "arXiv 2602.10408" in text


def test_csv_has_one_row_per_run_with_the_documented_columns(study, tmp_path):
  written = report.write_report(study, str(tmp_path / "out"))
  with open(written["csv"]) as f:
    rows = list(csv.DictReader(f))
  assert tuple(rows[0]) == run_rows.CSV_COLUMNS
  assert len(rows) == 15
  row = next(r for r in rows if r["cell"] == "baseline-1m-aux0-seed1")
  assert (row["variant"], row["size"], row["seed"], row["aux"], row["status"]) == (
    "baseline",
    "1m",
    "1",
    "0",
    "complete",
  )
  assert float(row["final_val_loss"]) == 2.2 and int(row["params"]) == 1_035_000
  tapered = next(r for r in rows if r["cell"] == "internal_taper-1m-aux1-seed1")
  assert float(row["scale_loss_weight"]) == 0.0 and float(tapered["scale_loss_weight"]) == pytest.approx(0.1)
  assert int(row["tokens"]) == STEPS * 16 * 512 and float(row["wall_time_s"]) == 10.0
  assert float(row["tokens_per_s"]) == pytest.approx(np.median(1000.0 + np.arange(STEPS)))
  assert row["mfu"] == ""  # no known peak for a CPU
  assert next(r for r in rows if r["cell"] == "all_taper-1m-aux0-seed2")["status"] == "missing"
  absent = {
    "decode_throughput.png",  # needs DIR/throughput.json (experiments.report --throughput)
    "fits_loss_vs_compute.png",
  }  # needs 3 sizes; this study has 2
  assert sorted(os.listdir(tmp_path / "out" / "figures")) == sorted(set(figures.FIGURES) - absent)
  assert os.path.getsize(written["report"]) > 0


def test_mfu_uses_the_peak_a_run_measured(study):
  run_dir = os.path.join(study, "baseline-3m-aux0-seed0")
  results_path = os.path.join(run_dir, "results.json")
  with open(results_path) as f:
    results = json.load(f)
  with open(results_path, "w") as f:
    json.dump({**results, "peak_flops": 1.5e11, "peak_source": "a measured CPU GEMM rate"}, f)
  run = run_rows.read_run(run_dir)
  fpt = 6 * PARAMS["3m"] + 12 * 8 * 64 * 512
  assert run.mfu == pytest.approx(run.tokens_per_s * fpt / 1.5e11)


def test_a_study_from_two_hosts_names_both_in_its_setup(study):
  """Runs record their CPU (results.json's cpu_identity, hardware.cpu_identity's fields); a size whose runs came from
  two hosts says so, and runs recorded before it say their device alone."""
  hosts = [
    {"vendor": "GenuineIntel", "family": 6, "model": 167, "model_name": "Intel(R) Xeon(R) Processor"},
    {"vendor": "AuthenticAMD", "family": 25, "model": 17, "model_name": "AMD EPYC 9B14"},
  ]
  for seed, host in enumerate(hosts):
    path = os.path.join(study, f"baseline-3m-aux0-seed{seed}", "results.json")
    with open(path) as f:
      results = json.load(f)
    with open(path, "w") as f:
      json.dump({**results, "device_kind": "cpu", "cpu_identity": host}, f)
  setup = next(line for line in report.setup_lines(run_rows.read_runs(study)) if line.startswith("* `3m`"))
  assert setup.endswith(
    "trained on cpu × 1 and cpu × 1 on AMD EPYC 9B14 (AuthenticAMD family 25 model 17) and "
    "cpu × 1 on Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 167)"
  ), setup


def test_mfu_uses_the_device_peak_when_known(study):
  run_dir = os.path.join(study, "baseline-3m-aux0-seed0")
  with open(os.path.join(run_dir, manifest.CELL_RECORD), "w") as f:
    json.dump({"status": "complete", "device_kind": "NVIDIA H100 80GB HBM3", "device_count": 1}, f)
  run = run_rows.read_run(run_dir)
  fpt = 6 * PARAMS["3m"] + 12 * 8 * 64 * 512
  assert run.mfu == pytest.approx(run.tokens_per_s * fpt / 989e12)


def test_figures_plot_one_line_per_seed_mean_and_marker(study):
  runs = run_rows.read_runs(study)
  groups = aggregate.aggregate(runs)
  drawn = figures.make_figures(runs, groups)
  assert set(drawn) == set(figures.FIGURES) - {
    "decode_throughput.png",
    "fits_gap_vs_params.png",
    "fits_loss_vs_compute.png",
  }  # no throughput or fits given
  ax = drawn["fig2_val_loss_vs_params.png"].axes[0]
  assert len(ax.containers) == 3  # baseline, internal_taper (+aux), all_taper (aux=0): one errorbar line each
  assert ax.get_xscale() == "log" and ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
  fig3 = drawn["fig3_logit_norm.png"]
  assert [len(ax.lines) for ax in fig3.axes] == [(3 + 1) + (2 + 1) + (2 + 1) + 1, (3 + 1) + (3 + 1) + 1]
  assert all(ax.get_yscale() == "log" for ax in fig3.axes)
  assert fig3.axes[0].lines[-1].get_xdata()[0] == 10  # taper start = round(0.25 · 40)
  fig4 = drawn["fig4_grad_norm.png"]  # at 1m, the size with an unanchored variant
  assert len(fig4.axes) == 4 and [len(ax.lines) for ax in fig4.axes] == [3 + 1] * 4
  assert "1m" in fig4.texts[0].get_text()
  loss_fig = drawn["train_loss_gate.png"]
  assert len(loss_fig.axes) == 4  # two sizes, each with a twin gate axis
  assert sorted(len(ax.lines) for ax in loss_fig.axes) == [1, 1, 2, 2]


def test_logit_growth_shows_in_the_dynamics_table(study):
  runs = run_rows.read_runs(study)
  text = tables.dynamics_markdown(curves.Curves(runs))
  steps = np.arange(4, STEPS, 5)
  growth = 1.08**39 / np.interp(10, steps, 1.08**steps)  # end / taper start (step 10, between two records)
  row = next(line for line in text.splitlines() if "all_taper (aux=0)" in line)
  assert "| unanchored |" in row and f"| {growth:.2f}× |" in row
  assert "| 1.00× |" in next(line for line in text.splitlines() if "| baseline |" in line)


def test_an_empty_directory_is_a_short_error(tmp_path):
  with pytest.raises(ValueError, match="no run directories"):
    report.write_report(str(tmp_path))


def test_a_damaged_history_is_refused_by_name(study):
  path = os.path.join(study, spec.Cell("baseline", "3m", 0, 1).name, "metrics.jsonl")
  with open(path) as f:
    lines = f.readlines()
  lines[7] = lines[7].replace('"loss": 4.3', '"loss": 4.4')  # still parses; the checksum no longer matches
  with open(path, "w") as f:
    f.writelines(lines)
  with pytest.raises(
    integrity.DamagedLinesError,
    match=re.escape(
      f"{path}: line 8 of {STEPS} (after step 6) is "
      "damaged (it does not match its checksum); the "
      "history of this run cannot be trusted"
    ),
  ):
    report.write_report(study)


def test_long_metrics_files_are_thinned_keeping_diagnostics_and_the_last_step(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for step in range(1000):
      f.write(json.dumps({"step": step, "loss": 1.0, **({"logit_norm": 5.0} if step % 100 == 37 else {})}) + "\n")
  records = run_rows.read_metrics(str(tmp_path), max_points=10)
  steps = [r["step"] for r in records]
  assert steps[-1] == 999 and {s for s in steps if s % 100 == 37} == set(range(37, 1000, 100))
  assert 15 <= len(records) <= 25


def test_a_run_that_learned_no_context_is_named_and_kept_out_of_every_mean(study, tmp_path):
  # baseline-3m: seed 0 (1.5) ends 0.05 nats under its unigram reference, seed 1 (1.7) 2 nats under it
  for seed, unigram in ((0, 1.55), (1, 3.7)):
    path = os.path.join(study, spec.Cell("baseline", "3m", 0, seed).name, "results.json")
    with open(path) as f:
      results = {**json.load(f), "unigram_val_loss": unigram}
    with open(path, "w") as f:
      json.dump(results, f)
  runs = {r.cell: r for r in run_rows.read_runs(study)}
  assert runs["baseline-3m-aux0-seed0"].status == "no_context" and "1.5500" in runs["baseline-3m-aux0-seed0"].error
  assert runs["baseline-3m-aux0-seed1"].status == "complete" and runs["baseline-3m-aux0-seed2"].unigram_loss is None
  groups = {(g.size, g.variant, g.aux): g for g in aggregate.aggregate(list(runs.values()))}
  base = groups[("3m", "baseline", 0)]
  assert base.losses == [1.7, 1.6] and base.no_context == [1.5] and base.expected == 3
  assert groups[("3m", "internal_taper", 1)].gap_pct == pytest.approx(100 * (1.7 - 1.65) / 1.65)
  written = report.write_report(study, str(tmp_path / "out"))
  text = open(written["report"]).read()
  assert "**Learned no context**" in text and "`baseline-3m-aux0-seed0` (validation loss 1.5 against" in text
  assert "1.6500 ± 0.0707 · n = 2 of 3 (**1 learned no context**)" in text
  with open(written["csv"]) as f:
    row = next(r for r in csv.DictReader(f) if r["cell"] == "baseline-3m-aux0-seed0")
  assert (row["status"], float(row["unigram_loss"])) == ("no_context", 1.55)
  fig = figures.figure_scaling(aggregate.aggregate(list(runs.values())))
  crosses = [line for line in fig.axes[0].lines if line.get_marker() == "x"]
  assert [tuple(line.get_ydata()) for line in crosses] == [(1.5,)]
  assert "baseline: learned no context (not in the mean)" in [t.get_text() for t in fig.axes[0].get_legend().texts]


def test_each_methods_tuned_setting_is_listed_and_the_setup_names_no_single_lr_it_did_not_share(study, tmp_path):
  runs = run_rows.read_runs(study)
  assert tables.settings_markdown(runs) == ""  # no run was tuned: no section
  for run in runs:  # the baseline tuned at 1m only, with its own LR
    if run.variant == "baseline" and run.size == "1m" and run.config:
      run.config = {**run.config, "tuned": "lr0.01_gain3", "opt": {"lr": 0.01}}
  table = tables.settings_markdown(runs)
  rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
  assert "lr0.01_gain3 (LR 0.01)" in rows["baseline"] and "defaults (LR 0.0003)" in rows["internal_taper (+aux)"]
  setup = report.setup_lines(runs)
  assert "peak LR per method" in next(line for line in setup if "`1m`" in line)
  assert "peak LR 0.0003" in next(line for line in setup if "`1m`" not in line)
