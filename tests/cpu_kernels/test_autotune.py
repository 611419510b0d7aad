"""Paths chosen by timing: the fastest candidate wins, near-ties keep the preferred one, the choice is cached per host
and shape, a forced path is never timed, and a Trainer whose kernels are slow on this host trains through XLA's."""

import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base
from tapernorm_jax import cpu_kernels
from tapernorm_jax.cpu_kernels import autotune, few_rows
from tapernorm_jax.model import ModelConfig, Transformer, sharding
from tapernorm_jax.train import loop, run_dir
from tapernorm_jax.train.trainer import Trainer

TINY = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 2,
  "model.T": 32,
  "model.V": 512,
  "train.batch_size": 8,
  "train.steps": 12,
  "train.log_every": 4,
  "train.diag_every": 6,
  "train.eval_batches": 1,
  "checkpoint.every": 6,
  "data.synthetic_train_stories": 200,
  "data.synthetic_valid_stories": 40,
}


@pytest.fixture(autouse=True)
def auto(monkeypatch, tmp_path):
  """`auto` means measure (the suite pins the kernels), with a cache of this test's own."""
  monkeypatch.setenv(autotune.ENV, "auto")
  monkeypatch.setenv("TAPERNORM_CACHE", str(tmp_path / "cache"))


def sleeper(seconds: float, built: list[str], name: str):
  """A candidate builder whose calls take `seconds`; records that it was built."""

  def build():
    built.append(name)
    run = lambda: time.sleep(seconds)
    run.seconds = seconds  # what a call takes, for tests that replace the timing
    return run

  return build


def test_the_fastest_candidate_is_chosen_and_cached_for_this_host_and_shape():
  built = []
  candidates = {
    "xla": sleeper(0.02, built, "xla"),
    "fast": sleeper(0.002, built, "fast"),
    "slow": sleeper(0.05, built, "slow"),
  }
  choice = autotune.choose("t", "tiny", {"D": 8}, candidates, prefer="xla")
  assert (choice.name, choice.how) == ("fast", "measured") and sorted(built) == ["fast", "slow", "xla"]
  assert choice.seconds["fast"] < choice.seconds["xla"] < choice.seconds["slow"]
  again = autotune.choose("t", "tiny", {"D": 8}, candidates, prefer="xla")
  assert (again.name, again.how) == ("fast", "cached") and len(built) == 3  # nothing built again
  other_shape = autotune.choose("t", "tiny", {"D": 16}, candidates, prefer="xla")
  assert other_shape.how == "measured" and len(built) == 6


def test_a_near_tie_keeps_the_preferred_candidate(monkeypatch):
  # each call's time as its sleep says: the rule under test, not the sleep's jitter on a loaded host (a 10 ms sleep
  # measured 11 ms once, beside 10 ms for the other, with the suite running twice on 2 cores)
  monkeypatch.setattr(autotune, "seconds_per_call", lambda run: run.seconds)
  candidates = {"xla": sleeper(0.010, [], "xla"), "kernels": sleeper(0.0099, [], "kernels")}  # 1% faster
  assert autotune.choose("t", "tie", {}, candidates, prefer="xla").name == "xla"


def test_noise_decides_nothing_a_real_lead_decides_after_the_least_rounds(monkeypatch):
  # per-call times drawn by the test: two candidates from one distribution (a tie), then one 20% faster
  rng = np.random.default_rng(0)
  monkeypatch.setattr(autotune, "seconds_per_call", lambda run: run.seconds * rng.lognormal(0.0, 0.05))
  monkeypatch.setattr(autotune, "cache_file", lambda what, shape: autotune.Path(os.devnull) / "x")  # never cached
  switched = 0
  for trial in range(300):
    choice = autotune.timed(
      "t", "tie", {"xla": sleeper(0.01, [], "xla"), "kernels": sleeper(0.01, [], "kernels")}, prefer="xla"
    )
    switched += choice.name != "xla"
  # a tie leaves the preferred candidate unless every sample of the other beats every one of its own over 5 rounds
  # (chance 2/C(10,5) = 0.8%) and its median by 3%; once samples overlap they overlap for good
  assert switched <= 0.02 * 300
  lead = autotune.timed(
    "t", "lead", {"xla": sleeper(0.01, [], "xla"), "kernels": sleeper(0.008, [], "kernels")}, prefer="xla"
  )
  assert (lead.name, lead.rounds, lead.tied) == ("kernels", autotune.MIN_ROUNDS, ("kernels",))
  tie = autotune.timed(
    "t",
    "tie",
    {"xla": sleeper(0.01, [], "xla"), "k1": sleeper(0.008, [], "k1"), "k2": sleeper(0.008, [], "k2")},
    prefer="xla",
  )
  # two kernels tied with each other, both clearly ahead of xla: the first offered wins, after every round
  assert tie.name == "k1" and tie.rounds == autotune.MAX_ROUNDS and "xla" not in tie.tied


def test_a_damaged_cache_entry_is_measured_again():
  candidates = {"xla": sleeper(0.01, [], "xla"), "fast": sleeper(0.001, [], "fast")}
  path = autotune.cache_file("t", {"n": 1})
  path.parent.mkdir(parents=True)
  path.write_text("{not json")
  assert autotune.choose("t", "damaged", {"n": 1}, candidates, prefer="xla").how == "measured"
  assert json.loads(path.read_text())["name"] == "fast"


def test_a_forced_path_is_not_timed_and_an_unknown_one_is_named(monkeypatch):
  built = []
  candidates = {"xla": sleeper(0.01, built, "xla"), "kernels": sleeper(0.001, built, "kernels")}
  assert autotune.choose("t", "forced", {}, candidates, prefer="xla", forced="xla") == autotune.Choice("xla", "forced")
  monkeypatch.setenv(autotune.ENV, "kernels")  # what `auto` stands for in this process
  assert autotune.choose("t", "env", {}, candidates, prefer="xla").name == "kernels" and not built
  with pytest.raises(ValueError, match="'fused' is not available here; choose auto or one of xla, kernels"):
    autotune.choose("t", "forced", {}, candidates, prefer="xla", forced="fused")


def test_the_host_signature_names_the_cpu_and_what_limits_it(monkeypatch):
  signature = autotune.host_signature()
  assert signature["cores"] >= 1 and signature["jaxlib"] and signature["devices"] == jax.device_count()
  before, flags = autotune.cache_file("t", {}), os.environ.get("XLA_FLAGS", "")
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")  # another ISA is another host
  assert autotune.cache_file("t", {}) != before
  monkeypatch.setenv("XLA_FLAGS", flags)
  assert autotune.cache_file("t", {}) == before
  for field, value in (("jax", "0.0.1"), ("kernels", "edited")):  # another jax or an edited kernel: timed again
    monkeypatch.setattr(autotune, "host_signature", lambda f=field, v=value, s=signature: {**s, f: v})
    assert autotune.cache_file("t", {}) != before


def config(data_dir, **changes):
  return base.override(base.get_config("all_taper"), {**TINY, "data.data_dir": str(data_dir), **changes})


def slowed(paths):
  """`paths` whose attention also sleeps 50 ms per call at run time (a kernel that loses on this host, whatever XLA
  makes of the arithmetic)."""
  projection, _ = paths

  def attend(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK):
    jax.debug.callback(lambda: time.sleep(0.05))
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, is_causal=True)

  return projection, attend


def test_a_trainer_whose_kernels_lose_here_trains_through_xla_without_being_told(monkeypatch, tmp_path):
  offered = cpu_kernels.training_paths
  monkeypatch.setattr(
    cpu_kernels,
    "training_paths",
    lambda cfg, mesh=None: {"xla": offered(cfg, mesh)["xla"], "kernels": slowed(offered(cfg, mesh)["xla"])},
  )
  trainer = Trainer(config(tmp_path), sharding.make_mesh())
  assert trainer.paths_choice == autotune.Choice("xla", "untimed")  # building a Trainer times nothing
  choice = trainer.choose_paths()
  assert (choice.name, choice.how) == ("xla", "measured") and choice.seconds["kernels"] > choice.seconds["xla"]
  assert trainer.attend is None and trainer.paths_choice is choice  # XLA's own attention, as `xla` means
  assert Trainer(config(tmp_path), sharding.make_mesh()).paths_choice.how == "cached"


def test_a_config_field_forces_the_paths_and_a_bad_one_is_named(tmp_path):
  trainer = Trainer(config(tmp_path, **{"train.cpu_paths": "kernel_products"}), sharding.make_mesh())
  assert trainer.paths_choice == autotune.Choice("kernel_products", "forced") and trainer.attend is None
  with pytest.raises(ValueError, match=r"train.cpu_paths='fastest': choose auto or one of xla, kernels"):
    Trainer(config(tmp_path, **{"train.cpu_paths": "fastest"}), sharding.make_mesh())


def test_a_run_records_its_paths_and_a_resume_keeps_them(tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  first = loop.run(config(tmp_path), workdir, stop_after=6)
  started = json.loads((workdir / run_dir.PATHS_FILE).read_text())
  assert first["cpu_paths"] == started and started["how"] == "measured"
  monkeypatch.setenv("TAPERNORM_CACHE", str(tmp_path / "another cache"))  # a resume must not time afresh
  resumed = loop.run(config(tmp_path), workdir)
  assert resumed["cpu_paths"]["name"] == started["name"] and resumed["cpu_paths"]["how"] == "forced"
  assert json.loads((workdir / "results.json").read_text())["cpu_paths"]["name"] == started["name"]


def test_decoding_a_few_rows_chooses_among_xla_the_kernel_and_row_by_row():
  cfg = ModelConfig(V=300, D=64, H=4, L=2, T=32, platform="cpu")
  variables = Transformer(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  offered = few_rows.decode_paths(cfg, rows=4)
  choice = few_rows.choose(variables, cfg, rows=4)
  assert choice.how == "measured" and set(choice.seconds) <= set(offered) and choice.name in offered
  variables_out, projection = few_rows.prepare(variables, cfg, rows=4)
  assert projection is offered[choice.name]
  assert (few_rows.MATVEC in variables_out) == (projection is few_rows.kernel_projection)
  assert few_rows.decode_paths(cfg, rows=9) == {"xla": few_rows.einsum}  # past 8 rows: XLA's GEMM only


CHOOSE_PATHS = """
from configs import base
from tapernorm_jax.model import sharding
from tapernorm_jax.train.trainer import Trainer
cfg = base.override(base.get_config("all_taper"), {**TINY, "model.D": 64, "train.batch_size": 16,
                                                   "data.data_dir": DATA})
print(Trainer(cfg, sharding.make_mesh()).choose_paths().describe())
"""


@pytest.mark.slow  # two fresh processes time every train path at one shape
def test_two_fresh_processes_choose_the_same_train_path(tmp_path):
  names, described = [], []
  for i in range(2):
    env = {**os.environ, "TAPERNORM_CACHE": str(tmp_path / f"cache{i}"), autotune.ENV: "auto"}
    code = f"TINY = {TINY!r}\nDATA = {str(tmp_path / 'data')!r}\n" + CHOOSE_PATHS
    out = subprocess.run(
      [sys.executable, "-c", code],
      capture_output=True,
      text=True,
      env=env,
      timeout=600,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
      check=True,
    ).stdout
    described.append(out.strip().splitlines()[-1])
    names.append(described[-1].split(" ")[0])
  assert names[0] == names[1], described  # each in its own cache: measured twice, chosen alike


def test_a_kernel_chosen_after_building_is_the_one_the_train_step_traces(monkeypatch, tmp_path):
  offered = cpu_kernels.training_paths
  monkeypatch.setattr(
    cpu_kernels,
    "training_paths",
    lambda cfg, mesh=None: {"xla": slowed(offered(cfg, mesh)["xla"]), "kernels": offered(cfg, mesh)["xla"]},
  )  # here XLA's own loses
  trainer = Trainer(config(tmp_path), sharding.make_mesh())
  state = trainer.init_state(0)
  batch = jax.device_put(np.zeros((8, 33), np.int32), trainer.batch_sharding)
  assert "callback" in trainer.train_step.lower(state, batch).as_text()  # untimed: the model's own, slowed
  assert trainer.choose_paths().name == "kernels"
  assert "callback" not in trainer.train_step.lower(state, batch).as_text()  # re-traced through the chosen
