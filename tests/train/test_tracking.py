"""Weights & Biases behind the tracker seam (train/tracking.py), offline, with nothing sent anywhere: a run killed and
resumed holds each step once with metrics.jsonl's values; a study's cells are grouped under the study; a tracker that
cannot start is one line and the training goes on. Runs where the `wandb` extra is installed (CI's extras leg)."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import jax
import pytest

from locations import ROOT
from tapernorm_jax.studies import spec
from tapernorm_jax.studies.launch import runner
from tapernorm_jax.train import loop, run_config, tracking

pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

SMALL = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 1,
  "model.T": 32,
  "model.V": 512,
  "train.batch_size": 8,
  "train.log_every": 4,
  "train.diag_every": 8,
  "train.eval_batches": 1,
  "checkpoint.every": 6,
  "data.synthetic_train_stories": 200,
  "data.synthetic_valid_stories": 30,
}


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
  """W&B's own settings and caches in the test's directory; any server it might try is a closed port on loopback."""
  for name, where in (
    ("WANDB_CONFIG_DIR", "config"),
    ("WANDB_CACHE_DIR", "cache"),
    ("WANDB_DATA_DIR", "data"),
    ("WANDB_ARTIFACT_DIR", "artifacts"),
  ):
    monkeypatch.setenv(name, str(tmp_path / "wandb-home" / where))
  monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY"):
    monkeypatch.delenv(name, raising=False)


def tiny(data_dir: str, steps: int, **tracking_fields) -> dict:
  """Config changes of a tiny run with W&B tracking."""
  return {
    **SMALL,
    "train.steps": steps,
    "data.data_dir": data_dir,
    **{f"tracking.{k}": v for k, v in tracking_fields.items()},
  }


def records(run_dir: str) -> list[tuple[str, wandb_internal_pb2.Record]]:
  """Every record of every W&B session of the run, in the order the sessions ran."""
  wandb_dir = os.path.join(run_dir, tracking.WANDB_DIR)
  out = []
  for name in sorted(d for d in os.listdir(wandb_dir) if d.startswith("offline-run-")):
    for data in tracking.wandb_records(os.path.join(wandb_dir, name, f"run-{tracking.run_id(run_dir)}.wandb")):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(data)
      out.append((name, record))
  return out


def history(run_dir: str) -> list[tuple[int, dict]]:
  """(step, values) of every history record the run's W&B sessions hold, in order."""
  wandb_dir = os.path.join(run_dir, tracking.WANDB_DIR)
  return [
    item
    for name in sorted(d for d in os.listdir(wandb_dir) if d.startswith("offline-run-"))
    for item in tracking.wandb_history(os.path.join(wandb_dir, name, f"run-{tracking.run_id(run_dir)}.wandb"))
  ]


def metrics_jsonl(run_dir: str) -> dict[int, dict]:
  """metrics.jsonl by step."""
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f)}


def test_a_killed_and_resumed_run_holds_each_step_once_with_the_values_of_metrics_jsonl(tmp_path):
  run_dir = str(tmp_path / "run")
  flags = [
    f"--config.{k}={v}"
    for k, v in tiny(
      str(tmp_path / "data"), 24, wandb_project="tapernorm-test", wandb_mode="offline", wandb_tags=("a", "b")
    ).items()
  ]
  cmd = [
    sys.executable,
    "-m",
    "experiments.tinystories",
    "--config=configs/all_taper.py",
    f"--workdir={run_dir}",
    *flags,
  ]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:  # killed past the checkpoint of step 12, before 18's
    if os.path.exists(path := os.path.join(run_dir, "metrics.jsonl")) and sum(1 for _ in open(path)) >= 16:
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.005)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
  done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  steps = [step for step, _ in history(run_dir)]
  jsonl = metrics_jsonl(run_dir)
  assert steps == sorted(set(steps)) and set(steps) == set(jsonl)  # each step once, in order, none missing
  for step, values in history(run_dir):
    expected = {k: v for k, v in jsonl[step].items() if k != "step" and isinstance(v, (int, float))}
    assert values == pytest.approx(expected, rel=1e-6), step
  runs = [r.run for _, r in records(run_dir) if r.WhichOneof("record_type") == "run"]
  # the same run resumed (a session killed before W&B wrote anything leaves only its file's header)
  assert runs and {r.run_id for r in runs} == {tracking.run_id(run_dir)}
  assert list(runs[-1].tags) == ["a", "b"] and runs[-1].project == "tapernorm-test"
  config = {u.key: json.loads(u.value_json) for u in runs[-1].config.update}
  assert config["variant"] == "all_taper" and config["train"]["steps"] == 24


def test_a_resumed_tracker_skips_the_steps_its_run_holds(tmp_path):
  run_dir = str(tmp_path / "run")
  settings = {"wandb_project": "tapernorm-test", "wandb_mode": "offline"}
  first = tracking.WandbTracker(settings, run_dir, {"seed": 0})
  for step in range(10):
    first.log(step, {"loss": float(step)})
  first.close()
  # W&B names an offline session's directory by the second it starts (offline-run-YYYYmmdd_HHMMSS-<id>): a second
  # session in the same second would share the first's directory and file. A resumed run starts seconds later.
  time.sleep(1.0 - time.time() % 1.0 + 0.05)
  second = tracking.WandbTracker(settings, run_dir, {"seed": 0})
  assert second.logged_through == 9
  for step in range(5, 15):  # a run resumed from step 5 trains 5-9 again
    second.log(step, {"loss": float(step)})
  second.close()
  assert history(run_dir) == [(step, {"loss": float(step)}) for step in range(15)]


def test_a_studys_cells_are_runs_in_a_group_named_after_the_study(tmp_path):
  cfg_changes = tiny(str(tmp_path / "data"), 4, wandb_project="tapernorm-test", wandb_mode="offline")
  cell = spec.Cell("baseline", "cpu", 0, 0, spec.frozen_overrides(cfg_changes))
  study = str(tmp_path / "ladder-study")
  status = runner.run_cell(cell, study, jax.devices()[:4], runner.trainer_run_fn(), reraise=True)
  assert status.state == "complete"
  (run,) = [r.run for _, r in records(os.path.join(study, cell.name)) if r.WhichOneof("record_type") == "run"]
  assert run.run_group == "ladder-study" and run.display_name == cell.name


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(wandb_project="a/b", wandb_mode="offline"), "tracking.wandb_project='a/b': W&B project names cannot"),
    (dict(wandb_project="tapernorm-test", wandb_mode="online"), "W&B could not start the run"),  # no login
  ],
)
def test_a_tracker_that_cannot_start_is_one_line_and_the_run_trains_on(tmp_path, fields, message, caplog):
  cfg = run_config.get_config("baseline", "size=cpu")
  cfg = run_config.override(cfg, tiny(str(tmp_path / "data"), 4, **fields))
  with caplog.at_level(logging.WARNING, logger=tracking.__name__):
    results = loop.run(cfg, str(tmp_path / "run"), devices=jax.devices()[:4])
  lines = [r.getMessage() for r in caplog.records if r.name == tracking.__name__]
  assert len(lines) == 1 and lines[0].startswith("tracking:") and message in lines[0] and "\n" not in lines[0], lines
  assert results["complete"] and len(metrics_jsonl(str(tmp_path / "run"))) == 4


def test_a_tracker_failing_mid_run_warns_once_and_stops(caplog):
  class Flaky:
    def __init__(self):
      self.calls = 0

    def log(self, step, scalars):
      self.calls += 1
      raise ConnectionError("the server went away")

    def close(self):
      raise AssertionError("a stopped tracker is not called again")

  flaky = Flaky()
  guarded = tracking.Guarded("W&B", flaky)
  with caplog.at_level(logging.WARNING, logger=tracking.__name__):
    for step in range(3):
      guarded.log(step, {"loss": 1.0})
  guarded.close()
  [record] = caplog.records
  assert "W&B stopped (ConnectionError: the server went away); training goes on" in record.getMessage()
  assert flaky.calls == 1
