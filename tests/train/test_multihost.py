"""Multi-host training, executed: two JAX processes on this machine (2 CPU devices each, gloo collectives, one shared
workdir as on a pod with a shared bucket) against the same run in one process on 4 devices.

(a) each process loads only its rows of every batch, and together exactly the single-process batch;
(b) the losses are the single-process run's; (c) checkpoints move between the pair and one process both ways;
(d) only process 0 writes config.json, metrics.jsonl (each step once), TensorBoard events and results.json.
"""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from configs import base
from tapernorm_jax import data
from tapernorm_jax.train.metrics import read_jsonl
from locations import ROOT

WORKER = os.path.join(ROOT, "tests", "train", "multihost_worker.py")
STEPS, B, T = 4, 8, 32
TINY = {"model.D": 32, "model.H": 4, "model.L": 1, "model.T": T, "model.V": 512, "train.steps": STEPS,
        "train.batch_size": B, "train.log_every": 1, "train.diag_every": 100, "train.eval_batches": 1,
        "checkpoint.every": 100, "taper.gate_warmup_frac": 0.5, "train.fixed_step": False, "opt.lr": 1e-3,
        "data.synthetic_train_stories": 400, "data.synthetic_valid_stories": 60}
MESHES = {"dp": {"mesh.data": -1, "mesh.fsdp": 1},  # the batch over all 4 devices, parameters replicated
          "fsdp": {"mesh.data": 1, "mesh.fsdp": 4}}  # the batch and every parameter sharded over all 4 devices
PROCESS0_ONLY = ("config.json", "metrics.jsonl", "results.json", "tensorboard")


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, str]:
  """The tiny corpus (prepared once here, so that the processes only read it) and a compilation cache for every run."""
  data_dir = str(tmp_path_factory.mktemp("data"))
  data.prepare(base.override(base.get_config("all_taper"), {**TINY, "data.data_dir": data_dir}).data)
  return {"data_dir": data_dir, "cache": str(tmp_path_factory.mktemp("compilation_cache"))}


def free_port() -> int:
  """A TCP port nobody listens on now."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Run:
  """A training run's processes, their output files and where they record what they loaded and wrote."""

  procs: list[subprocess.Popen]
  logs: list[tuple[str, str]]  # (stdout, stderr) paths per process
  record: str


def start(num_processes: int, shared: dict, workdir: str, mesh: dict, record: str,
          stop_after: int | None = None, changes: dict | None = None) -> Run:
  """Starts training in `num_processes` processes with 4 // num_processes CPU devices each."""
  os.makedirs(record, exist_ok=True)
  port, procs, logs = free_port(), [], []
  # Every run is compiled alike, without LLVM's optimisations: 5x faster to compile here.
  env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0", "JAX_PLATFORMS": "cpu"}
  for i in range(num_processes):
    spec = {"process_id": i, "num_processes": num_processes, "port": port, "local_devices": 4 // num_processes,
            "workdir": workdir, "changes": {**TINY, "data.data_dir": shared["data_dir"], **mesh, **(changes or {})},
            "stop_after": stop_after, "record": record, "compilation_cache": shared["cache"]}
    logs.append((os.path.join(record, f"stdout{i}"), os.path.join(record, f"stderr{i}")))
    with open(logs[i][0], "w") as out, open(logs[i][1], "w") as err:
      procs.append(subprocess.Popen([sys.executable, WORKER, json.dumps(spec)], cwd=ROOT, env=env, stdout=out,
                                    stderr=err))
  return Run(procs, logs, record)


def finish(*runs: Run, timeout: float = 240) -> list[list[dict]]:
  """Waits for `runs`; per run and process: its layout, the files it wrote, the rows it loaded and its stdout. A
  failed or late run fails the test with every one of its processes' stderr."""
  procs = [p for run in runs for p in run.procs]
  deadline = time.time() + timeout
  while time.time() < deadline and any(p.poll() is None for p in procs):
    if any(p.poll() not in (None, 0) for p in procs):  # one failed: its partner would wait for it until a timeout
      break
    time.sleep(0.1)
  timed_out = time.time() >= deadline
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()
  for run in runs:
    if any(p.returncode != 0 for p in run.procs):
      report = "\n".join(f"--- process {i} (exit {p.returncode}), stderr's last 4000 characters:\n"
                         f"{read(run.logs[i][1])[-4000:]}" for i, p in enumerate(run.procs))
      pytest.fail(f"the {len(run.procs)}-process run failed{f' (timed out after {timeout} s)' if timed_out else ''}"
                  f":\n{report}")
  results = []
  for run in runs:
    results.append([])
    for i in range(len(run.procs)):
      with open(os.path.join(run.record, f"process{i}.json")) as f:
        results[-1].append({**json.load(f), "rows": np.load(os.path.join(run.record, f"process{i}.npz"))["rows"],
                            "stdout": read(run.logs[i][0])})
  return results


def read(path: str) -> str:
  with open(path) as f:
    return f.read()


def losses(workdir: str) -> list[float]:
  return [r["loss"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def results_of(workdir: str) -> dict:
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


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
  [[reference], processes] = finish(start(1, shared, single, MESHES["dp"], str(tmp_path / "record1")),
                                    start(2, shared, pair, MESHES["dp"], str(tmp_path / "record2")))
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
  [[reference], stopped, _] = finish(start(1, shared, single, mesh, str(tmp_path / "record1")),
                                     start(2, shared, first, mesh, str(tmp_path / "record2"), stop_after=2),
                                     start(1, shared, second, mesh, str(tmp_path / "record3"), stop_after=2))
  check_rows(stopped, reference["rows"][:2])
  assert not os.path.exists(os.path.join(first, "results.json"))
  state_files = os.listdir(os.path.join(first, "checkpoints", "2", "state"))
  assert any("process_1" in name for name in state_files), state_files  # process 1 wrote its shards there
  [_, processes] = finish(start(1, shared, first, mesh, str(tmp_path / "record4")),
                          start(2, shared, second, mesh, str(tmp_path / "record5")))
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
  [processes] = finish(start(2, shared, workdir, mesh, str(tmp_path / "record2"),
                             changes={**every_step, "checkpoint.on_damaged": "fallback"}))
  results = results_of(workdir)
  assert results["complete"] and results["resumed_from"] == 2  # both processes fell back to step 2, together
  assert "the checkpoint at step 3 is damaged" in processes[0]["stdout"] and "moved it aside" in processes[0]["stdout"]
  moved = [name for name in os.listdir(checkpoints) if name.startswith("3.damaged-")]
  assert len(moved) == 1 and os.path.isdir(os.path.join(checkpoints, moved[0]))
  assert [r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))] == list(range(STEPS))
