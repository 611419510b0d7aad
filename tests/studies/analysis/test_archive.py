"""Saving a study's records to commit and putting them back: complete runs only, no checkpoints, histories thinned to
lines of the original with their checksums, the report's rows unchanged, and a restored study counted as done."""

import json
import os

import pytest

from tapernorm_jax.storage import integrity
from tapernorm_jax.studies import manifest, spec
from tapernorm_jax.studies.analysis import archive, run_rows
from sweep_helpers import run_cli

STEPS = 3000
CELLS = [spec.Cell("baseline", "1m", 0, 0), spec.Cell("all_taper", "1m", 1, 0), spec.Cell("all_taper", "1m", 1, 1)]


def write_run(workdir: str, cell: spec.Cell, complete: bool) -> None:
  """A run directory as training leaves it: config, a checked history with diagnostics every 100 steps, a
  checkpoint, and (when `complete`) results."""
  run_dir = os.path.join(workdir, cell.name)
  os.makedirs(os.path.join(run_dir, "checkpoints", "100"))
  config = {"variant": cell.variant, "size": "1m", "seed": cell.seed, "taper": {"scale_loss_weight": 0.1 * cell.aux}}
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    json.dump({**config, "model": {"L": 8, "D": 64, "T": 512, "V": 10_000}, "train": {"steps": STEPS}}, f)
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    for step in range(STEPS if complete else 700):
      record = {"step": step, "loss": 5.0 - step / STEPS, "tokens_per_s": 1000.0 + step % 7}
      f.write(integrity.checked_line(record | ({"logit_norm": 3.0} if step % 100 == 99 else {})))
  if complete:
    results = {**config, "steps": STEPS, "tokens": STEPS * 8192, "final_val_loss": 2.0 + cell.seed / 10}
    with open(os.path.join(run_dir, "results.json"), "w") as f:
      json.dump({**results, "params": 1_035_000, "wall_time_s": 10.0, "complete": True}, f)


@pytest.fixture
def study(tmp_path) -> str:
  workdir = str(tmp_path / "study")
  for i, cell in enumerate(CELLS):
    write_run(workdir, cell, complete=i < 2)
  manifest.write_manifest(workdir, {"name": "test"}, CELLS)
  with open(os.path.join(workdir, "predictions.json"), "w") as f:
    json.dump({"size": "1m"}, f)
  return workdir


def test_only_complete_runs_are_saved_without_checkpoints_and_with_thinned_checked_histories(study, tmp_path):
  dest = str(tmp_path / "archive")
  assert archive.save(study, dest, max_points=200) == sorted(c.name for c in CELLS[:2])
  assert sorted(os.listdir(dest)) == sorted([c.name for c in CELLS[:2]] + ["predictions.json", "sweep.json"])
  for cell in CELLS[:2]:
    assert sorted(os.listdir(os.path.join(dest, cell.name))) == ["config.json", "metrics.jsonl", "results.json"]
    with open(os.path.join(study, cell.name, "metrics.jsonl")) as f:
      original = f.readlines()
    with open(os.path.join(dest, cell.name, "metrics.jsonl")) as f:
      saved = f.readlines()
    assert set(saved) <= set(original) and all(integrity.line_body(line) for line in saved)
    assert saved[-1] == original[-1] and 200 <= len(saved) <= 200 + STEPS // 100 + 1
    assert {line for line in original if "logit_norm" in line} <= set(saved)


def test_the_reports_rows_read_the_same_from_the_archive(study, tmp_path):
  dest = str(tmp_path / "archive")
  archive.save(study, dest)
  fields = ("cell", "status", "final_val_loss", "params", "steps", "tokens")
  rows = lambda d: [[getattr(r, f) for f in fields] for r in run_rows.read_runs(d) if r.status == "complete"]
  assert rows(dest) == rows(study) and len(rows(study)) == 2


def test_a_restored_study_counts_its_runs_done_and_keeps_what_it_has(study, tmp_path):
  dest, fresh = str(tmp_path / "archive"), str(tmp_path / "fresh")
  archive.save(study, dest)
  assert archive.restore(dest, fresh) == (sorted(c.name for c in CELLS[:2]), [])
  assert all(manifest.cell_status(os.path.join(fresh, c.name)).state == "complete" for c in CELLS[:2])
  assert os.path.exists(os.path.join(fresh, "predictions.json")) and manifest.read_manifest(fresh)
  assert archive.restore(dest, study) == ([], sorted(c.name for c in CELLS[:2]))
  assert os.path.isdir(os.path.join(study, CELLS[0].name, "checkpoints"))  # what the study had is left alone


def test_the_entry_point_says_what_it_did_and_names_a_missing_study(study, tmp_path):
  dest = str(tmp_path / "archive")
  done = run_cli("experiments.archive", f"--workdir={study}", f"--save_to={dest}")
  assert f"saved 2 complete runs of {study} to {dest}" in done.stdout
  missing = run_cli("experiments.archive", f"--workdir={tmp_path}/nothing", f"--save_to={dest}", check=False)
  assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1] == (
    f"error: --workdir={tmp_path}/nothing: no study here (no sweep.json); give a sweep's --workdir"
  )
  both = run_cli("experiments.archive", f"--workdir={study}", check=False)
  assert both.returncode == 2 and "give one of --save_to=DIR" in both.stderr
