"""The train mode of the peer benchmark without PyTorch (benchmarks/pytorch/training.py, workers.py): cells, the
first-loss, parameter, dtype and allocator checks, a whole cell against stand-in peers, this project's worker
processes, and the table's rows and round-by-round ratios. test_training_hf.py runs the real peer."""

import os
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy

from tapernorm_jax.benchmarks.pytorch import forward, parity, training, training_table, workers
from tapernorm_jax.train import run_config
from locations import ROOT

CELL = "cpu:8x16"  # B a multiple of the tests' 8 fake devices


@pytest.mark.parametrize("cell", ["9m", "9m:4", "10m:4x512", "9m:0x512", "9m:4x1"])
def test_a_cell_that_does_not_parse_is_refused_by_name(cell):
  with pytest.raises(ValueError, match=f"train_cells: '{cell}' is not SIZE:BATCHxT"):
    forward.Settings(size="cpu", dtype="float32", train_cells=(cell,))
  assert training.parse_cell("30m:1x512") == ("30m", 1, 512)


def test_the_first_losses_must_agree():
  assert parity.check_loss(9.2103, 9.2104)["relative_difference"] == pytest.approx(1e-4 / 9.2103, rel=1e-3)
  with pytest.raises(parity.LossMismatchError, match=r"9\.300000 differs from this project's 9\.210300"):
    parity.check_loss(9.2103, 9.3)


def one_step(lr: float = 1e-4, decay: float = 0.1, seed: int = 0) -> dict[str, np.ndarray]:
  """A sign-like Adam step of two tensors (a matrix that decays, a gain that does not) at `lr`."""
  rng = np.random.default_rng(seed)
  w, g = rng.normal(0, 0.02, (64, 32)), np.ones(64)
  return {"w": w - lr * (np.sign(rng.normal(size=w.shape)) + decay * w), "g": g - lr * np.sign(rng.normal(size=64))}


def test_parameters_after_one_step_must_agree_and_so_must_the_update():
  initial = {"w": np.random.default_rng(0).normal(0, 0.02, (64, 32)), "g": np.ones(64)}
  ours = one_step()
  theirs = {**{k: v + 1e-9 for k, v in ours.items()}, "lm_head.weight": np.zeros(3)}  # the peer may hold more
  agreed = parity.compare_params(ours, theirs, initial)
  assert agreed["relative"] < 1e-6 and agreed["update_relative_l2"] < 1e-3
  with pytest.raises(parity.ParamMismatchError, match="has no parameters"):
    parity.compare_params(ours, {"w": theirs["w"]})
  with pytest.raises(parity.ParamMismatchError, match=r"peer's w has shape \(32, 64\)"):
    parity.compare_params(ours, {**theirs, "w": theirs["w"].T})
  with pytest.raises(parity.ParamMismatchError, match="differs from this project's by .* of its largest entry"):
    parity.compare_params(ours, {**theirs, "w": theirs["w"] + 1e-3})
  tenth_more = one_step(lr=1.1e-4)  # a learning rate 10% off: within the float32 bound on the weights, not the update
  assert parity.compare_params(ours, tenth_more)["relative"] < parity.PARAM_TOLERANCE["float32"]
  with pytest.raises(parity.ParamMismatchError, match="first update of [wg] differs"):
    parity.compare_params(ours, tenth_more, initial)
  assert parity.compare_params(ours, tenth_more, initial, update_tolerance=None)["update_relative_l2"] > 0.05


def test_the_dtypes_must_agree():
  f32 = {"param": "float32", "compute": "float32"}
  assert parity.check_dtypes(f32, dict(f32))["peer"] == f32
  with pytest.raises(
    parity.DtypeMismatchError, match="float32 weights and float32 compute, this project with float32 and bfloat16"
  ):
    parity.check_dtypes({"param": "float32", "compute": "bfloat16"}, f32)


def test_every_worker_of_a_row_runs_with_the_same_allocator():
  described = lambda *settings: {f"w{i}": {"allocator": {"setting": s}} for i, s in enumerate(settings)}
  assert parity.check_allocators("default", described("default", "default")) == {"setting": "default"}
  with pytest.raises(parity.AllocatorMismatchError, match="w0: default, w1: project settings"):
    parity.check_allocators("default", described("default", "project settings"))


class StandInPeer:
  """A peer that is this project's baseline again (a second Trainer in a directory of its own, the same seed and
  batch), so its loss and parameters must agree; `loss_offset` and `update_scale` make it disagree."""

  def __init__(self, spec, loss_offset: float = 0.0, update_scale: float = 1.0):
    self.directory = os.path.join(spec["directory"], spec["contender"])
    os.makedirs(self.directory)
    self.ours = training.OurStep({**spec, "contender": "baseline", "directory": self.directory})
    self.spec, self.loss_offset, self.update_scale, self.steps = spec, loss_offset, update_scale, 0

  def describe(self):
    return {"dtypes": self.spec["dtypes"]}

  def check(self):
    out = self.ours.check()
    after = dict(np.load(out["params"]))
    initial = safetensors.numpy.load_file(os.path.join(self.directory, "llama", "model.safetensors"))
    after = {k: v + (self.update_scale - 1) * (v - initial[k]) for k, v in after.items()}
    np.savez(out["params"], **after)
    return {"loss": out["loss"] + self.loss_offset, "params": out["params"], "ran": "a stand-in"}

  def step(self):
    self.steps += 1
    return self.ours.step()

  def wait(self, out):
    self.ours.wait(out)


class CannotCompile(StandInPeer):
  def check(self):
    return {"na": "InductorError: no C++ compiler"}


def in_process(peers: dict, made: list) -> training.Spawn:
  """A spawn that builds every contender in this process (this project's real ones, the stand-in peers)."""

  def spawn(name, spec, allocator):
    spec = {**spec, "contender": name}
    contender = peers[name](spec) if name in peers else training.OurStep(spec)
    made.append(contender)
    header = {"contender": name, "allocator": {"setting": allocator, "keep_freed_memory": "in this process"}}
    return workers.InProcessWorker(name, contender, header)

  return spawn


def settings(**changes):
  return forward.Settings(size="cpu", dtype="float32", repeats=2, warmup=0, min_sample_s=0.0, **changes)


def test_a_cell_checks_the_peers_then_times_every_contender_in_turn():
  made = []
  spawn = in_process({"hf_eager": StandInPeer, "hf_compiled": CannotCompile}, made)
  row = training.bench_cell(CELL, "project settings", spawn, settings(), {"flops": 1e11, "source": "a test peak"})
  c = row["contenders"]
  assert row["loss"]["hf_eager"]["relative_difference"] < 1e-6 and "hf_compiled" not in row["loss"]
  assert row["param_agreement"]["hf_eager"]["relative"] < 1e-6
  assert row["dtypes"]["hf_eager"]["peer"] == {"param": "float32", "compute": "float32"}
  assert c["hf_compiled"] == {"na": "InductorError: no C++ compiler"}
  assert all(len(c[name]["seconds"]) == 2 for name in ("hf_eager", "baseline", "taper"))
  assert made[3].steps >= 1 + 2  # warm-up, then one sample per round
  assert set(row["ratios"]) == {
    "baseline/hf_eager",
    "library/hf_eager",
    "library/baseline",
    "taper/hf_eager",
    "taper/baseline",
  }
  assert row["first_step"]["library"]["loss"] == row["first_step"]["baseline"]["loss"]
  assert row["first_step"]["taper"]["gate"] < 1 and row["first_step"]["baseline"]["lr"] == pytest.approx(1e-4)
  model = run_config.get_config("baseline", "size=cpu").model
  assert row["flops_per_token"] == 6 * row["params"] + 12 * model.L * model.D * 16
  assert c["baseline"]["mfu"] == pytest.approx(c["baseline"]["median"] * row["flops_per_token"] / 1e11)
  table = training_table.markdown([row], repeats=2, min_sample_s=0.0)
  assert "| cpu | 8 × 16 | project settings |" in table and "n/a" in table
  assert "* HF torch.compile: n/a (InductorError: no C++ compiler)" in table and "* HF eager: a stand-in" in table
  assert "Both sides in float32 weights and float32 compute" in table


@pytest.mark.parametrize(
  "peer_kind, error",
  [
    (lambda spec: StandInPeer(spec, loss_offset=0.01), parity.LossMismatchError),
    (lambda spec: StandInPeer(spec, update_scale=1.2), parity.ParamMismatchError),
  ],
)
def test_a_peer_that_computes_otherwise_is_never_timed(peer_kind, error):
  made = []
  with pytest.raises(error, match="no timing is reported"):
    training.bench_cell(CELL, "default", in_process({"hf_eager": peer_kind}, made), settings(compile=False))
  assert all(getattr(m, "steps", 0) == 0 for m in made)


def test_this_project_s_worker_runs_in_its_own_process_with_the_row_s_allocator(tmp_path):
  spawn = training.process_spawner([sys.executable, "-m", "experiments.peer_train_worker"], cwd=str(ROOT))
  spec = {"cell": CELL, "seed": 0, "dtype": "float32", "directory": str(tmp_path)}
  worker = spawn("baseline", spec, "default")
  try:
    ready = worker.ready
    assert ready["allocator"] == {
      "setting": "default",
      "set_before_jax": True,
      "keep_freed_memory": "turned off by TAPERNORM_KEEP_FREED_MEMORY=0",
    }
    assert ready["pid"] != os.getpid() and ready["dtypes"] == {"param": "float32", "compute": "float32"}
    assert worker.request("check")["params"] == str(tmp_path / "baseline.npz")
    assert worker.request("warmup 1 0.0")["loops"] == 1 and worker.request("time")["seconds"] > 0
    with pytest.raises(workers.WorkerError, match="unknown command 'nonsense'"):
      worker.request("nonsense")
  finally:
    worker.close()
  assert worker.process.returncode == 0
  assert {"llama", "batch.npy", "baseline.npz", "baseline.log"} <= set(os.listdir(tmp_path))


def test_the_library_built_baseline_starts_as_a_script_does_with_the_entry_point_s_settings(tmp_path):
  spawn = training.process_spawner([sys.executable, "-m", "experiments.peer_train_worker"], cwd=str(ROOT))
  spec = {"cell": CELL, "seed": 0, "dtype": "float32", "directory": str(tmp_path)}
  started = {}
  try:
    for name in ("baseline", "library"):  # the baseline first: it writes the batch
      started[name] = spawn(name, spec, "project settings")
    ready = {name: worker.ready for name, worker in started.items()}
    assert ready["baseline"]["entry_point"] is True and ready["library"]["entry_point"] is False
    assert (
      ready["library"]["allocator"]
      == ready["baseline"]["allocator"]
      == {"setting": "project settings", "keep_freed_memory": "set", "set_before_jax": True}
    )
    assert ready["library"]["cpu_paths"] == ready["baseline"]["cpu_paths"]
    first = {name: worker.request("check") for name, worker in started.items()}
    assert first["library"]["loss"] == first["baseline"]["loss"] and first["library"]["lr"] == first["baseline"]["lr"]
  finally:
    for worker in started.values():
      worker.close()


def test_a_worker_that_dies_is_reported_with_its_stderr(tmp_path):
  argv = [sys.executable, "-c", "import sys; print('the reason', file=sys.stderr); sys.exit(3)"]
  with pytest.raises(workers.WorkerError, match=r"(?s)w worker exited \(code 3\) during 'starting'.*the reason"):
    workers.WorkerProcess("w", argv, dict(os.environ), str(tmp_path / "w.log"))


def test_the_table_has_a_row_per_allocator_and_takes_ratios_round_by_round():
  drift = (1.0, 1.6, 0.9)  # the machine's speed per round, shared by every contender: cancels from each ratio
  rate = lambda median: {"median": median, "seconds": [1 / (median * f) for f in drift], "mfu": 0.25}
  contenders = {
    "hf_eager": rate(1000.0),
    "hf_compiled": rate(1500.0),
    "baseline": rate(1800.0),
    "library": rate(1782.0),
    "taper": rate(1764.0),
  }
  seconds = lambda name: contenders[name]["seconds"]
  ratios = {
    key: forward.paired_ratio(seconds(key.split("/")[0]), seconds(key.split("/")[1]))
    for key in ("baseline/hf_eager", "baseline/hf_compiled", "taper/baseline", "library/baseline")
  }
  f32 = {"param": "float32", "compute": "float32"}
  row = lambda allocator, effect: {
    "size": "9m",
    "B": 4,
    "T": 512,
    "allocator": allocator,
    "allocator_in_effect": effect,
    "contenders": contenders,
    "ratios": ratios,
    "loss": {"hf_eager": {"relative_difference": 2e-8}},
    "param_agreement": {"hf_eager": {"relative": 3e-6, "update_relative_l2": 4e-5}},
    "dtypes": {"hf_eager": {"ours": f32, "peer": f32}},
    "peak": {"flops": 1e11, "source": "a test peak"},
    "first_step": {
      "hf_eager": {"ran": "eager; AdamW fused=True"},
      "hf_compiled": {
        "ran": "torch.compile of the whole step",
        "graphs": 4,
        "graph_breaks": ["Unsupported Tensor.backward() call"],
      },
    },
  }
  rows = [
    row("default", {"setting": "default"}),
    row("project settings", {"setting": "default", "keep_freed_memory": "malloc is not glibc's on darwin"}),
  ]
  table = training_table.markdown(rows, repeats=3, min_sample_s=3.0)
  assert (
    "| 9m | 4 × 512 | default | 1,000 | 1,500 | 1,800 | 1,782 | 1,764 | 1.80× (1.80–1.80) | 1.20× (1.20–1.20) | "
    "0.98× (0.98–0.98) | 0.99× (0.99–0.99) | 25.0% |"
  ) in table
  assert "| 9m | 4 × 512 | project settings (not in effect: malloc is not glibc's on darwin) | 1,000 |" in table
  assert "parameters after that step within 3.0e-06 of each tensor's largest entry" in table
  assert "* HF torch.compile: torch.compile of the whole step; 4 graphs, split at: Unsupported Tensor" in table


def test_the_cpu_peak_is_a_measured_gemm_rate():
  p = training.hardware.peak()
  assert jax.default_backend() == "cpu" and "measured float32 GEMM rate" in p["source"]
  assert 1e9 < p["flops"] / jax.process_count() < 1e14 and np.isfinite(p["flops"])
