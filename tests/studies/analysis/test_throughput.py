"""Each method's inference-form decode throughput beside a study's losses (throughput.py)."""

import json
import os

import jax
import numpy as np
import pytest

from tapernorm_jax.benchmarks import study_throughput
from tapernorm_jax.studies.analysis import figures, report, throughput
from tapernorm_jax.studies.launch import grid, runner
from sweep_helpers import quiet, run_cli, tiny_sweep


def row(
  size: str,
  variant: str,
  aux: int,
  params: int,
  tokens_s: float,
  ratio: tuple[float, float, float] | None,
  form: str = "folded",
) -> dict:
  """One throughput.json row as `measure` writes it."""
  vs = dict(zip(("median", "min", "max"), ratio)) if ratio else None
  return {
    "size": size,
    "variant": variant,
    "aux": aux,
    "seed": 0,
    "params": params,
    "form": form,
    "tokens_s": {"median": tokens_s, "min": tokens_s, "max": tokens_s, "spread": 0.0, "seconds": [1.0]},
    "vs_baseline": vs,
  }


RESULT = {
  "hardware": {"cpu": "Some CPU", "cpu_count": 2, "backend": "cpu", "jax": "0"},
  "settings": {"batch": 1, "prompt": 32, "new_tokens": 64, "repeats": 5},
  "rows": [
    row("cpu", "baseline", 0, 226_752, 1234.4, (1.0, 1.0, 1.0), "plain norms"),
    row("cpu", "dyt", 0, 226_900, 1100.0, (0.89, 0.81, 0.95), "dyt norms"),
    row("cpu_l", "baseline", 0, 649_600, 800.0, (1.0, 1.0, 1.0), "plain norms"),
  ],
}


def test_the_table_puts_each_method_in_a_row_and_each_size_in_a_column():
  lines = throughput.markdown(RESULT).splitlines()
  assert lines[0].split("|")[1:-1] == [" method ", " inference form ", " cpu (226.8K) ", " cpu_l (649.6K) "]
  assert lines[2].split("|")[1:-1] == [
    " baseline ",
    " plain norms ",
    " 1,234 · 1.00× (1.00–1.00) ",
    " 800 · 1.00× (1.00–1.00) ",
  ]
  assert lines[3].split("|")[1:-1] == [" dyt ", " dyt norms ", " 1,100 · 0.89× (0.81–0.95) ", " — "]  # not timed
  assert "Some CPU (2 cores" in throughput.settings_text(RESULT)


def test_the_figure_draws_a_line_per_method_in_both_panels():
  fig = figures.figure_throughput(RESULT)
  speed_ax, ratio_ax = fig.axes
  assert [len(line.get_xdata()) for line in speed_ax.get_lines()] == [2, 1]  # baseline at two sizes, dyt at one
  assert speed_ax.get_yscale() == "log" and "tokens/s" in speed_ax.get_ylabel()
  assert [c.lines[0].get_ydata().tolist() for c in ratio_ax.containers] == [[1.0, 1.0], [0.89]]  # median ratios
  assert figures.figure_throughput(None) is None


@pytest.mark.slow
def test_a_study_is_timed_in_its_inference_forms_and_reported(tmp_path, data_dir):
  sweep = {**tiny_sweep(data_dir, [dict(variants=["baseline", "all_taper", "dyt"], sizes=["cpu"])]), "seeds": (0, 1)}
  workdir = str(tmp_path / "study")
  cells = grid.expand(sweep)
  runner.run(cells, workdir, devices=jax.devices()[:1], echo=quiet)
  settings = study_throughput.Settings(prompt=4, new_tokens=5, repeats=3, warmup=0, min_sample_s=0.0)
  result = study_throughput.measure(workdir, settings)
  rows = {r["variant"]: r for r in result["rows"]}
  assert {v: (r["seed"], r["form"]) for v, r in rows.items()} == {
    "baseline": (0, "plain norms"),
    "all_taper": (0, "folded"),
    "dyt": (0, "dyt norms"),
  }  # the lowest seed
  for r in rows.values():  # tokens/s from the seconds of each round: B × (N − 1) tokens per loop
    seconds = np.asarray(r["tokens_s"]["seconds"])
    assert len(seconds) == 3 and r["tokens_s"]["median"] == pytest.approx(np.median(4 / seconds))
    ratios = np.asarray(rows["baseline"]["tokens_s"]["seconds"]) / seconds
    assert r["vs_baseline"]["median"] == pytest.approx(np.median(ratios))  # paired round by round
  with open(os.path.join(workdir, throughput.FILE)) as f:
    assert json.load(f)["rows"] == json.loads(json.dumps(result["rows"]))
  written = report.write_report(workdir)
  text = open(written["report"]).read()
  assert "## Decode throughput of each method's inference form" in text
  assert "| all_taper (+aux) | folded |" in text and "| dyt | dyt norms |" in text
  assert os.path.exists(os.path.join(workdir, "figures", "decode_throughput.png"))


def test_bad_settings_and_an_empty_study_are_named(tmp_path):
  with pytest.raises(ValueError, match="new_tokens=1: must be >= 2"):
    study_throughput.Settings(new_tokens=1)
  with pytest.raises(ValueError, match="no complete runs to time"):
    study_throughput.measure(str(tmp_path), study_throughput.Settings())
  with pytest.raises(ValueError, match="no such directory"):
    study_throughput.measure(str(tmp_path / "missing"), study_throughput.Settings())


def test_throughput_needs_the_checkpoints_here():
  done = run_cli("experiments.report", "--workdir=gs://bucket/study", "--throughput", check=False)
  assert done.returncode == 2 and "--throughput needs the study's checkpoints here" in done.stderr + done.stdout
