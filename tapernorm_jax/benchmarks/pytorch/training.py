"""This project's train step next to a peer's (Hugging Face Llama + torch AdamW), each contender in its own process.

`python -m experiments.benchmark_peer --modes=train` times, per cell (size, batch × T), one full optimiser step —
forward, backward, global-norm clipping, AdamW — of four contenders: Hugging Face `LlamaForCausalLM` with torch's
AdamW, eager (`hf_eager`, AdamW `fused=True`) and with the whole step as one function under `torch.compile`
(`hf_compiled`), and this project's jitted `baseline` and TaperNorm (`all_taper`) mid-taper
(experiments/peer_train_hf.py and `OurStep`). Every contender runs in a long-lived worker process of its own
(experiments/peer_train_worker.py, which keeps its compiled step and its state); the coordinator asks the workers in
turn for one timed sample each per round (`workers.py`'s line protocol), so rounds interleave and every ratio is taken
round by round (`timing.paired_ratio`): load drifts slower than a round cancel. The whole set runs twice per cell:
every worker with glibc malloc's defaults, then every worker with the project's settings (`allocator.keep_freed_memory`,
set before torch or jax is imported); each worker reports what it runs with, and a row whose workers differ stops.

Before anything is timed, per cell and allocator row: the peer loads the baseline's initial weights (a Llama
checkpoint, hf/llama.py) and steps at the baseline's learning rate; both sides must compute in the same dtypes
(float32 on a CPU; bf16 compute on float32 weights on accelerators, the peer under autocast) or the run stops; each
peer contender's first loss must be the baseline's, and its parameters after that first step must be the baseline's
(`peer_parity.py`, on the Llama checkpoint's names). This module needs no PyTorch.
"""

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import safetensors.numpy

from tapernorm_jax.runtime import costs, hardware
from tapernorm_jax.benchmarks import train as train_bench
from tapernorm_jax.benchmarks.pytorch import parity, workers
from tapernorm_jax.benchmarks.timing import paired_ratio, summary
from tapernorm_jax.hf import llama
from tapernorm_jax.hf.hub import WEIGHTS_FILE
from tapernorm_jax.model import param_count
from tapernorm_jax.taper.variants import SIZES
from tapernorm_jax.train.trainer import Trainer

PyTree = Any
CELLS = ("1m:16x512", "9m:4x512", "30m:1x512")  # the grid: a step of about the same cost on 2 cores
OURS = {"baseline": "baseline", "library": "baseline", "taper": "all_taper"}  # contender → variant
# How each of ours is started: through an entry point (experiments/, as `python -m experiments.NAME` runs), or as a
# user's script or notebook builds a Trainer (malloc's documented call first, no entry point: library_worker.py).
LIBRARY_WORKER = [sys.executable, "-m", "tapernorm_jax.benchmarks.pytorch.library_worker"]
PEERS = ("hf_eager", "hf_compiled")  # experiments/peer_train_hf.py
LABELS = {
  "hf_eager": "HF eager",
  "hf_compiled": "HF torch.compile",
  "baseline": "ours baseline",
  "library": "ours baseline, library-built",
  "taper": "ours all_taper, 0 < g < 1",
}
ALLOCATORS = {"default": "0", "project settings": "1"}  # row → TAPERNORM_KEEP_FREED_MEMORY in every worker
OPT = {"lr": 1e-4, "weight_decay": 0.1}  # every contender's; decay > 0 so the one-step check covers its mask
Spawn = Callable[[str, dict[str, Any], str], Any]  # (contender, spec, allocator row) → a ready workers.WorkerProcess


def parse_cell(cell: str) -> tuple[str, int, int]:
  """`9m:4x512` → ("9m", 4, 512); ValueError naming the cell otherwise."""
  m = re.fullmatch(r"(\w+):(\d+)x(\d+)", cell)
  if not m or m.group(1) not in SIZES or int(m.group(2)) < 1 or int(m.group(3)) < 2:
    raise ValueError(f"train_cells: {cell!r} is not SIZE:BATCHxT with SIZE one of {', '.join(SIZES)} (e.g. 9m:4x512)")
  return m.group(1), int(m.group(2)), int(m.group(3))


def make_trainer(variant: str, cell: str, dtype: str) -> Trainer:
  """A Trainer of `variant` on the cell's size and B × T batches, computing in `dtype`, with OPT's optimiser."""
  size, B, T = parse_cell(cell)
  return train_bench.make_trainer(variant, size, B, T, OPT, dtype=dtype)


def dtypes(trainer: Trainer) -> dict[str, str]:
  """The trainer's weight and compute dtypes by name."""
  cfg = trainer.model_cfg
  return {"param": jnp.dtype(cfg.param_dtype).name, "compute": jnp.dtype(cfg.compute_dtype).name}


class OurStep:
  """This project's jitted train step of one contender (`OURS`) in a worker (`workers.Contender`). The baseline writes
  what the peers start from: its initial weights as a Llama checkpoint (`DIR/llama`) and the batch (`DIR/batch.npy`);
  it and the library-built baseline step at the peak of their learning rate, TaperNorm mid-taper (0 < g < 1)."""

  def __init__(self, spec: dict[str, Any]):
    self.name, directory = spec["contender"], spec["directory"]
    self.trainer = tr = make_trainer(OURS[self.name], spec["cell"], spec["dtype"])
    state = tr.init_state(spec["seed"])
    self.params_path = os.path.join(directory, f"{self.name}.npz")
    if self.name == "baseline":
      _, B, T = parse_cell(spec["cell"])
      llama.save_llama(
        {"params": tr.per_layer(state)["params"], "calib": state["calib"]},
        tr.model_cfg,
        os.path.join(directory, "llama"),
      )
      batch_BxT1 = np.random.default_rng(spec["seed"]).integers(0, tr.model_cfg.V, (B, T + 1), dtype=np.int32)
      np.save(os.path.join(directory, "batch.npy"), batch_BxT1)
    else:
      batch_BxT1 = np.load(os.path.join(directory, "batch.npy"))
    # lr(step) = the peak: what the peer steps with
    state = train_bench.mid_taper(tr, state) if self.name == "taper" else placed(state, tr.phases.lr_warmup)
    self.state, self.batch_BxT1 = state, jax.device_put(batch_BxT1, tr.batch_sharding)

  def describe(self) -> dict[str, Any]:
    """Backend, dtypes, paths, size, the optimiser as the peer must configure its own, and whether an entry point
    started this process."""
    tr, opt = self.trainer, self.trainer.cfg.opt
    step = int(self.state["step"])
    return {
      "backend": jax.default_backend(),
      "dtypes": dtypes(tr),
      "step": step,
      "cpu_paths": tr.paths_choice.record(),
      "entry_point": "experiments" in sys.modules,  # false in the library-built baseline's process
      "params": param_count(self.state["params"]),
      "L": tr.model_cfg.L,
      "D": tr.model_cfg.D,
      "optimizer": {
        "lr": float(tr.lr(step)),
        "b1": opt.b1,
        "b2": opt.b2,
        "eps": opt.eps,
        "weight_decay": opt.weight_decay,
        "clip": opt.clip,
      },
    }

  def check(self) -> dict[str, Any]:
    """The first step (it compiles): its loss; the baseline's parameters after it, under the Llama names."""
    self.state, metrics = self.trainer.train_step(self.state, self.batch_BxT1)
    out = {"loss": float(metrics["loss"]), "gate": float(metrics["gate"]), "lr": float(metrics["lr"])}
    if self.name == "baseline":
      np.savez(
        self.params_path,
        **llama.llama_tensors({"params": self.trainer.per_layer(self.state)["params"]}, self.trainer.model_cfg),
      )
      out["params"] = self.params_path
    return out

  def step(self) -> jax.Array:
    """One step, dispatched."""
    self.state, metrics = self.trainer.train_step(self.state, self.batch_BxT1)
    return metrics["loss"]

  def wait(self, out: jax.Array) -> None:
    """Until the step (and the new state) is done."""
    jax.block_until_ready((out, self.state))


def placed(state: dict, step: int) -> dict:
  """`state` at `step` for the schedules: its step counter and the learning-rate schedule's own count (optax's), while
  Adam's count stays, so the next update is Adam's first, as a fresh peer's is, at the learning rate of `step`."""
  at = lambda count: jax.device_put(jnp.asarray(step, count.dtype), count.sharding)
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  opt_state = jax.tree.map(
    lambda x: x._replace(count=at(x.count)) if is_schedule(x) else x, state["opt_state"], is_leaf=is_schedule
  )
  return {**state, "step": at(state["step"]), "opt_state": opt_state}


def process_spawner(command: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> Spawn:
  """Starts workers as `command + [SPEC as JSON]` (e.g. python -m experiments.peer_train_worker; the library-built
  baseline as `LIBRARY_WORKER`) with the row's TAPERNORM_KEEP_FREED_MEMORY, no preallocation of a GPU's memory by jax
  (several processes share it), and their stderr in the cell's directory."""

  def spawn(name: str, spec: dict[str, Any], allocator: str) -> workers.WorkerProcess:
    environ = {
      **os.environ,
      **(env or {}),
      "TAPERNORM_KEEP_FREED_MEMORY": ALLOCATORS[allocator],
      "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }
    log = os.path.join(spec["directory"], f"{name}.log")
    argv = [*(LIBRARY_WORKER if name == "library" else command), json.dumps({**spec, "contender": name})]
    return workers.WorkerProcess(name, argv, environ, log, cwd)

  return spawn


def start(cell: str, allocator: str, spawn: Spawn, s: Any, directory: str, started: dict[str, Any]) -> None:
  """Starts the cell's workers into `started` (so the caller can stop those already up if one fails), the baseline
  first: it writes what the peers load. `--nocompile` leaves hf_compiled out."""
  spec = {"cell": cell, "seed": s.seed, "dtype": s.dtype, "directory": directory}
  started["baseline"] = spawn("baseline", spec, allocator)
  ours = started["baseline"].ready
  peer_spec = {
    **spec,
    "optimizer": ours["optimizer"],
    "dtypes": ours["dtypes"],
    "threads": s.threads,
    "device": "cuda" if ours["backend"] == "gpu" else "cpu",
  }
  for name in (name for name in OURS if name not in started):  # the library-built baseline and TaperNorm
    started[name] = spawn(name, spec, allocator)
  for name in PEERS if s.compile else PEERS[:1]:
    started[name] = spawn(name, peer_spec, allocator)


def checked(started: dict[str, Any], directory: str) -> tuple[dict[str, Any], dict[str, str]]:
  """The peers' dtypes against the baseline's (before any step), then each worker's first step and the peers' losses
  and parameters after it against the baseline's: (the checks, the reason per contender that cannot run)."""
  ours = started["baseline"].ready
  checks: dict[str, Any] = {
    "dtypes": {
      name: parity.check_dtypes(ours["dtypes"], started[name].ready["dtypes"]) for name in PEERS if name in started
    },
    "loss": {},
    "params": {},
  }
  first = checks["first_step"] = {name: w.request("check") for name, w in started.items()}
  na = {name: c["na"] for name, c in first.items() if "na" in c}
  if "baseline" in na:
    raise workers.WorkerError(f"the baseline's first step failed: {na['baseline']}")
  compute = ours["dtypes"]["compute"]
  initial = safetensors.numpy.load_file(os.path.join(directory, "llama", WEIGHTS_FILE))
  ours_after = dict(np.load(first["baseline"]["params"]))
  for name in PEERS:
    if name not in started or name in na:
      continue
    checks["loss"][name] = parity.check_loss(
      first["baseline"]["loss"], first[name]["loss"], parity.LOSS_TOLERANCE[compute], LABELS[name]
    )
    checks["params"][name] = parity.compare_params(
      ours_after,
      dict(np.load(first[name]["params"])),
      initial,
      parity.PARAM_TOLERANCE[compute],
      parity.UPDATE_TOLERANCE[compute],
    )
  return checks, na


def bench_cell(cell: str, allocator: str, spawn: Spawn, s: Any, peak: dict | None = None) -> dict[str, Any]:
  """One cell in one allocator row: the workers started and checked, then `s.repeats` rounds in which each runnable
  contender times one sample of at least `s.min_sample_s` in turn; throughputs, round-by-round ratios and MFU."""
  size, B, T = parse_cell(cell)
  started: dict[str, Any] = {}
  with tempfile.TemporaryDirectory(prefix="tapernorm-peer-train-") as directory:
    try:
      start(cell, allocator, spawn, s, directory, started)
      described = {name: w.ready for name, w in started.items()}
      in_effect = parity.check_allocators(allocator, described)
      checks, na = checked(started, directory)
      if not s.compile:
        na["hf_compiled"] = "skipped: --nocompile"
      runnable = [name for name in (*PEERS, *OURS) if name in started and name not in na]
      for name in runnable:
        started[name].request(f"warmup {max(s.warmup, 1)} {s.min_sample_s}")
      samples: dict[str, list[float]] = {name: [] for name in runnable}
      for _ in range(s.repeats):
        for name in runnable:  # one sample each, in turn: a round
          samples[name].append(started[name].request("time")["seconds"])
    finally:
      for worker in started.values():
        worker.close()
  ours = described["baseline"]
  flops = costs.train_flops_per_token(ours["params"], ours["L"], ours["D"], T)
  contenders: dict[str, Any] = {}
  for name in (*PEERS, *OURS):
    if name in na:
      contenders[name] = {"na": na[name]}
    elif name in samples:
      contenders[name] = summary(samples[name], B * T)
      contenders[name]["mfu"] = costs.mfu(contenders[name]["median"], flops, peak and peak["flops"])
  ratios = {
    f"{a}/{b}": paired_ratio(samples[a], samples[b])
    for a in OURS
    for b in (*PEERS, "baseline")
    if a != b and a in samples and b in samples
  }
  row = {
    "cell": cell,
    "size": size,
    "B": B,
    "T": T,
    "allocator": allocator,
    "allocator_in_effect": in_effect,
    "params": ours["params"],
    "flops_per_token": flops,
    "dtypes": checks["dtypes"],
    "loss": checks["loss"],
    "param_agreement": checks["params"],
    "workers": described,
    "first_step": {n: {k: v for k, v in c.items() if k != "params"} for n, c in checks["first_step"].items()},
    "contenders": contenders,
    "ratios": ratios,
    "peak": peak,
  }
  log_cell(row)
  return row


def bench(s: Any, spawn: Spawn) -> list[dict[str, Any]]:
  """Every cell of `s.train_cells` in each allocator row, the rows of a cell back to back."""
  peak = hardware.peak()
  return [bench_cell(cell, allocator, spawn, s, peak) for cell in s.train_cells for allocator in ALLOCATORS]


def log_cell(row: dict) -> None:
  """One line per cell and row: each contender's median tokens/s and the baseline's ratio to each peer contender."""
  c, r = row["contenders"], row["ratios"]
  cells = ", ".join(f"{LABELS[n]} " + (f"{x['median']:,.0f} tok/s" if "median" in x else "n/a") for n, x in c.items())
  ratios = ", ".join(f"{k} {v['median']:.2f}×" for k, v in r.items())
  print(f"train {row['cell']} (allocator: {row['allocator']}): {cells}; {ratios}", flush=True)
