"""Multi-host training, executed: two JAX processes on this machine (2 CPU devices each, gloo collectives, one shared
workdir as on a pod with a shared bucket) against the same run in one process on 4 devices.

(a) each process loads only its rows of every batch, and together exactly the single-process batch;
(b) the losses are the single-process run's; (c) checkpoints move between the pair and one process both ways;
(d) only process 0 writes config.json, metrics.jsonl (each step once), TensorBoard events and results.json.
"""

import json
import os

import numpy as np
import pytest

from tapernorm_jax.train.metrics import read_jsonl
from multihost import B, MESHES, PROCESS0_ONLY, STEPS, finish, losses, prepare_shared, results_of, start


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, str]:
  return prepare_shared(tmp_path_factory)


def check_rows(processes: list[dict], batches: list[np.ndarray]) -> None:
  """(a): per step, each process loaded B/2 rows, the two sets are disjoint, and their union is the batch."""
  assert len(processes[0]["rows"]) == len(processes[1]["rows"]) == len(batches)
  for step, batch_BxT1 in enumerate(batches):
    whole = {tuple(row) for row in batch_BxT1}
    assert len(whole) == B  # distinct windows: a row's content names its example
    parts = [{tuple(row) for row in p["rows"][step]} for p in processes]
    assert [len(p["rows"][step]) for p in processes] == [B // 2, B // 2] and all(len(s) == B // 2 for s in parts)
    assert not parts[0] & parts[1], f"step {step}: both processes loaded a row"
    assert parts[0] | parts[1] == whole, f"step {step}: the processes' rows are not the single-process batch"


def check_writers(processes: list[dict], workdir: str, first_step: int = 0) -> None:
  """(d): process 0 alone wrote the run's files, metrics once per step; the checkpoint is shared work."""
  assert [p["process_index"] for p in processes] == [0, 1] and processes[0]["process_count"] == 2
  assert sorted(processes[0]["devices"]) == sorted(processes[0]["local_devices"] + processes[1]["local_devices"])
  assert len(processes[0]["devices"]) == 4 and all(p["collectives"] == "gloo" for p in processes)
  for name in PROCESS0_ONLY:
    assert not [f for f in processes[1]["written"] if f.split(os.sep)[0] == name], (name, processes[1]["written"])
  assert "metrics.jsonl" in processes[0]["written"]
  assert any(f.startswith("tensorboard" + os.sep) for f in processes[0]["written"])
  assert [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == list(range(STEPS))
  assert len(os.listdir(os.path.join(workdir, "tensorboard"))) == 1 + (first_step > 0)  # one file per writing run
  assert "run directory:" in processes[0]["stdout"] and "run directory:" not in processes[1]["stdout"]


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_two_processes_load_their_rows_and_train_as_one(shared, tmp_path):
  single, pair = str(tmp_path / "single"), str(tmp_path / "pair")
  [[reference], processes] = finish(
    start(1, shared, single, MESHES["dp"], str(tmp_path / "record1")),
    start(2, shared, pair, MESHES["dp"], str(tmp_path / "record2")),
  )
  check_rows(processes, reference["rows"])
  np.testing.assert_allclose(losses(pair), losses(single), rtol=1e-5)
  results = results_of(pair)
  assert results["complete"] and results["devices"] == 4 and results["steps"] == STEPS
  assert results["final_val_loss"] == pytest.approx(results_of(single)["final_val_loss"], rel=1e-5)
  with open(os.path.join(pair, "config.json")) as f:
    assert json.load(f)["mesh"]["process_id"] == 0
  check_writers(processes, pair)


@pytest.mark.slow  # six training processes, with checkpoints
def test_checkpoints_move_between_two_processes_and_one(shared, tmp_path):
  mesh = MESHES["fsdp"]  # every parameter sharded across both processes
  single, first, second = (str(tmp_path / name) for name in ("single", "pair-then-single", "single-then-pair"))
  # The pair stops at step 2 in `first`, one process at step 2 in `second`; then each resumes the other's checkpoint.
  [[reference], stopped, _] = finish(
    start(1, shared, single, mesh, str(tmp_path / "record1")),
    start(2, shared, first, mesh, str(tmp_path / "record2"), stop_after=2),
    start(1, shared, second, mesh, str(tmp_path / "record3"), stop_after=2),
  )
  check_rows(stopped, reference["rows"][:2])
  assert not os.path.exists(os.path.join(first, "results.json"))
  state_files = os.listdir(os.path.join(first, "checkpoints", "2", "state"))
  assert any("process_1" in name for name in state_files), state_files  # process 1 wrote its shards there
  [_, processes] = finish(
    start(1, shared, first, mesh, str(tmp_path / "record4")), start(2, shared, second, mesh, str(tmp_path / "record5"))
  )
  check_rows(processes, reference["rows"][2:])  # the pair continued the single process's data stream
  for workdir in (first, second):
    np.testing.assert_allclose(losses(workdir), losses(single), rtol=1e-5)
    results = results_of(workdir)
    assert results["resumed_from"] == 2
    assert results["final_val_loss"] == pytest.approx(results_of(single)["final_val_loss"], rel=1e-5)
  check_writers(processes, second, first_step=2)


@pytest.mark.slow  # two 2-process runs
def test_a_checkpoint_one_process_cannot_read_falls_back_on_both(shared, tmp_path):
  mesh, workdir = MESHES["fsdp"], str(tmp_path / "pair")
  every_step = {"checkpoint.every": 1}
  finish(start(2, shared, workdir, mesh, str(tmp_path / "record1"), stop_after=3, changes=every_step))
  checkpoints = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(checkpoints)) == ["1", "2", "3"]
  shards = os.path.join(checkpoints, "3", "state", "ocdbt.process_1", "d")  # written, and read back, by process 1
  largest = max((os.path.join(shards, name) for name in os.listdir(shards)), key=os.path.getsize)
  os.truncate(largest, os.path.getsize(largest) // 2)
  [processes] = finish(
    start(
      2, shared, workdir, mesh, str(tmp_path / "record2"), changes={**every_step, "checkpoint.on_damaged": "fallback"}
    )
  )
  results = results_of(workdir)
  assert results["complete"] and results["resumed_from"] == 2  # both processes fell back to step 2, together
  assert "the checkpoint at step 3 is damaged" in processes[0]["stdout"] and "moved it aside" in processes[0]["stdout"]
  moved = [name for name in os.listdir(checkpoints) if name.startswith("3.damaged-")]
  assert len(moved) == 1 and os.path.isdir(os.path.join(checkpoints, moved[0]))
  assert [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == list(range(STEPS))
