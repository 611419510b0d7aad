"""The multi-process harness the multi-host tests share: a tiny run in N JAX processes on this machine (4 CPU devices
in all, gloo collectives, one shared workdir), started, awaited, and read back."""

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
TINY = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 1,
  "model.T": T,
  "model.V": 512,
  "train.steps": STEPS,
  "train.batch_size": B,
  "train.log_every": 1,
  "train.diag_every": 100,
  "train.eval_batches": 1,
  "checkpoint.every": 100,
  "taper.gate_warmup_frac": 0.5,
  "train.fixed_step": False,
  "opt.lr": 1e-3,
  "data.synthetic_train_stories": 400,
  "data.synthetic_valid_stories": 60,
}
MESHES = {
  "dp": {"mesh.data": -1, "mesh.fsdp": 1},  # the batch over all 4 devices, parameters replicated
  "fsdp": {"mesh.data": 1, "mesh.fsdp": 4},
}  # the batch and every parameter sharded over all 4 devices
PROCESS0_ONLY = ("config.json", "metrics.jsonl", "results.json", "tensorboard")


def prepare_shared(tmp_path_factory) -> dict[str, str]:
  """For a module's `shared` fixture: the tiny corpus (prepared once here, so that the processes only read it) and a
  compilation cache for every run."""
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


def start(
  num_processes: int,
  shared: dict,
  workdir: str,
  mesh: dict,
  record: str,
  stop_after: int | None = None,
  changes: dict | None = None,
) -> Run:
  """Starts training in `num_processes` processes with 4 // num_processes CPU devices each."""
  os.makedirs(record, exist_ok=True)
  port, procs, logs = free_port(), [], []
  # Every run is compiled alike, without LLVM's optimisations: 5x faster to compile here.
  env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0", "JAX_PLATFORMS": "cpu"}
  for i in range(num_processes):
    spec = {
      "process_id": i,
      "num_processes": num_processes,
      "port": port,
      "local_devices": 4 // num_processes,
      "workdir": workdir,
      "changes": {**TINY, "data.data_dir": shared["data_dir"], **mesh, **(changes or {})},
      "stop_after": stop_after,
      "record": record,
      "compilation_cache": shared["cache"],
    }
    logs.append((os.path.join(record, f"stdout{i}"), os.path.join(record, f"stderr{i}")))
    with open(logs[i][0], "w") as out, open(logs[i][1], "w") as err:
      procs.append(
        subprocess.Popen([sys.executable, WORKER, json.dumps(spec)], cwd=ROOT, env=env, stdout=out, stderr=err)
      )
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
      report = "\n".join(
        f"--- process {i} (exit {p.returncode}), stderr's last 4000 characters:\n{read(run.logs[i][1])[-4000:]}"
        for i, p in enumerate(run.procs)
      )
      pytest.fail(
        f"the {len(run.procs)}-process run failed{f' (timed out after {timeout} s)' if timed_out else ''}:\n{report}"
      )
  results = []
  for run in runs:
    results.append([])
    for i in range(len(run.procs)):
      with open(os.path.join(run.record, f"process{i}.json")) as f:
        results[-1].append(
          {
            **json.load(f),
            "rows": np.load(os.path.join(run.record, f"process{i}.npz"))["rows"],
            "stdout": read(run.logs[i][0]),
          }
        )
  return results


def read(path: str) -> str:
  with open(path) as f:
    return f.read()


def losses(workdir: str) -> list[float]:
  return [r["loss"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def results_of(workdir: str) -> dict:
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)
