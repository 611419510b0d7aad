"""`python -m experiments.compile_check` end to end, as a user runs it: the table and its files, the ranked
suggestions, and a run that does not fit ending in one line (exit 2) with its report still written."""

import json
import subprocess
import sys

import pytest

from aot_helpers import needs_libtpu
from locations import ROOT

pytestmark = [needs_libtpu, pytest.mark.slow]


def compile_check(*args: str) -> subprocess.CompletedProcess:
  """The entry point in a fresh process from the checkout."""
  return subprocess.run(
    [sys.executable, "-m", "experiments.compile_check", "--topology=v5e:2x2", *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=1200,
  )


def test_the_check_writes_its_table_and_ranks_other_splits(tmp_path):
  done = compile_check(
    "--config=configs/all_taper.py:size=cpu",
    "--programs=train_step,eval_step",
    "--suggest",
    "--suggest_limit=2",
    f"--out={tmp_path}",
  )
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  assert [p["program"] for p in results["programs"]] == ["train_step", "eval_step"]
  assert all(p["fits"] for p in results["programs"]) and results["chips"] == 4
  steps = [s["step_s"] for s in results["suggestions"] if s["fits"]]
  assert len(results["suggestions"]) == 2 and steps == sorted(steps)
  page = (tmp_path / "report.md").read_text()
  assert "| train_step |" in page and "## Other splits" in page and results["command"] in page
  (tmp_path / "report.md").unlink()
  done = subprocess.run(
    [sys.executable, "-m", "experiments.compile_check", f"--render={tmp_path}"],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert done.returncode == 0 and (tmp_path / "report.md").read_text() == page, done.stderr[-3000:]


def test_a_run_that_does_not_fit_ends_in_one_line_and_keeps_its_report(tmp_path):
  done = compile_check(
    "--config=configs/all_taper.py:size=cpu",
    "--config.model.T=512",
    "--config.model.D=128",
    "--config.model.H=1",
    "--config.model.V=32768",
    "--config.model.L=1",
    "--config.train.batch_size=2048",
    "--config.mesh.fsdp=4",
    "--suggest_limit=1",
    f"--out={tmp_path}",
  )
  assert done.returncode == 2, done.stderr[-3000:]
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith("error: train_step does not fit: it needs ") and "a v5e chip has 15.75 GiB" in last
  assert "Traceback" not in done.stderr
  assert json.loads((tmp_path / "results.json").read_text())["programs"][0]["fits"] is False


def test_serving_programs_alone_compile_split_and_a_split_that_does_not_divide_is_one_line(tmp_path):
  common = ["--config=configs/all_taper.py:size=cpu", "--config.mesh.fsdp=4"]  # F = 171: padded to 172
  done = compile_check(*common, "--programs=serve_decode_step", "--serve_tensor=4", f"--out={tmp_path}")
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  assert [p["program"] for p in results["programs"]] == ["serve_decode_step"] and results["decoding"]["tensor"] == 4
  assert "served split over 4 chips per copy" in (tmp_path / "report.md").read_text()
  done = compile_check(*common, "--config.model.H=2", "--programs=serve_decode_step", "--serve_tensor=4")
  assert done.returncode != 0 and "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1] == (
    "error: model.H=2 does not split over tensor=4 devices; choose a divisor of it"
  ), done.stderr[-2000:]
