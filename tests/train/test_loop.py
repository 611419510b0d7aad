"""The training job end to end on the offline corpus: results, metrics, resume, checkpoints, failures."""

import collections
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from configs import base
from tapernorm_jax import data
from tapernorm_jax.inference import loading
from tapernorm_jax.model import sharding
from tapernorm_jax.train import loop, run_dir
from tapernorm_jax.storage.unreadable import DamagedCheckpointError
from tapernorm_jax.train.checkpoint import Checkpointer
from tapernorm_jax.train.metrics import of_the_run, read_jsonl
from tapernorm_jax.train.trainer import Trainer
from locations import ROOT

# 24 steps: warmup and calibration EMAs over steps 0-5, taper 6 → 18, then the g = 0 fixed step.
TINY = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 2,
  "model.T": 32,
  "model.V": 512,
  "train.steps": 24,
  "train.batch_size": 8,
  "train.log_every": 4,
  "train.diag_every": 8,
  "train.eval_batches": 2,
  "checkpoint.every": 6,
  "taper.gate_warmup_frac": 0.25,
  "taper.taper_end": 18,
  "opt.lr": 1e-3,
  "data.synthetic_train_stories": 400,
  "data.synthetic_valid_stories": 60,
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("data"))


def config(data_dir: str, variant: str = "all_taper", **changes):
  """The tiny config with `changes` (dotted keys) applied."""
  return base.override(base.get_config(variant, "tuned=0"), {**TINY, "data.data_dir": data_dir, **changes})


def resume_in_fresh_process(workdir: str, data_dir: str, variant: str = "all_taper", **changes) -> None:
  """Runs `python -m experiments.tinystories` with the tiny config in a new interpreter."""
  flags = [f"--config.{k}={v}" for k, v in {**TINY, "data.data_dir": data_dir, **changes}.items()]
  subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.tinystories",
      f"--config=configs/{variant}.py:tuned=0",
      f"--workdir={workdir}",
      *flags,
    ],
    cwd=ROOT,
    check=True,
    capture_output=True,
    timeout=600,
  )


def losses(workdir: str) -> list[float]:
  return [r["loss"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
  workdir = str(tmp_path_factory.mktemp("full"))
  return workdir, loop.run(config(data_dir, **{"train.profile_steps": 2, "train.profile_start": 4}), workdir)


def test_end_to_end_warmup_calibrate_taper_to_zero(uninterrupted, data_dir):
  workdir, results = uninterrupted
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records] == list(range(24))
  assert records[0]["gate"] == 1.0 and records[-1]["gate"] == 0.0
  cs = [v for k, v in records[-1].items() if k.startswith("c/")]
  assert len(cs) == 5 and all(np.isfinite(cs)) and all(abs(c - 1) > 1e-3 for c in cs)  # 4 internal + final
  assert np.mean([r["ce"] for r in records[-4:]]) < np.mean([r["ce"] for r in records[:4]]) - 0.3
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  assert {k: v for k, v in saved.items() if k != "sha256"} == json.loads(json.dumps(results))  # and its seal
  assert np.isfinite(saved["final_val_loss"]) and saved["complete"] and saved["steps"] == 24
  assert saved["corpus"].startswith("synthetic-stories") and saved["variant"] == "all_taper"
  assert saved["tokens"] == 24 * 8 * 32 and saved["schema"] == run_dir.RESULTS_SCHEMA
  # validations during the taper are taken at the gate the model trains at (the half-cosine from step 6 to 18), at
  # g = 0 once it is 0 for good
  gates = {r["step"] + 1: r["val_gate"] for r in records if "val_loss" in r}
  assert (
    gates == pytest.approx({8: 0.5 * (1 + np.cos(np.pi * 2 / 12)), 16: 0.5 * (1 + np.cos(np.pi * 10 / 12)), 24: 0.0})
    and saved["val_gate"] == 0.0
  )
  prepared = data.prepare(config(data_dir).data)  # the unigram reference: frequencies of the train stream, scored
  seen = collections.Counter(prepared.tokens("train").tolist())  # on the validation windows the run evaluated
  targets = np.concatenate([w[:, 1:].ravel() for w in data.eval_batches(prepared, 8, 32, 2)]).tolist()
  total = sum(seen.values()) + prepared.vocab_size
  assert saved["unigram_val_loss"] == pytest.approx(-np.mean([np.log((seen[t] + 1) / total) for t in targets]))
  assert saved["val_unseen_tokens"] == sum(seen[t] == 0 for t in targets)
  steady = np.median([r["tokens_per_s"] for r in records[1:]])  # the first step read includes compiling
  assert saved["tokens_per_s"] == pytest.approx(steady, rel=1e-6)
  m = json.load(open(os.path.join(workdir, "config.json")))["model"]
  assert saved["flops_per_token"] == 6 * saved["params"] + 12 * m["L"] * m["D"] * m["T"]
  assert "measured float32 GEMM rate" in saved["peak_source"]
  listed = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
  lscpu = dict(line.split(":", 1) for line in listed if ":" in line)
  cpu = saved["cpu_identity"]  # the host's exact CPU, as lscpu names it
  assert (cpu["vendor"], cpu["model"]) == (lscpu["Vendor ID"].strip(), int(lscpu["Model"].strip()))
  assert saved["mfu"] == pytest.approx(saved["tokens_per_s"] * saved["flops_per_token"] / saved["peak_flops"])
  assert glob.glob(os.path.join(workdir, "profile", "**", "*.xplane.pb"), recursive=True)  # train.profile_steps
  for key in (
    "logit_norm",
    "radial_grad",
    "s_mean",
    "s_tgt",
    "val_loss",
    "grad_norm/qkv",
    "grad_norm/mlp_out",
    "tokens_per_s",
    "lr",
    "scale_loss",
  ):
    assert key in records[7], key
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # Linux: KiB; the peak so far
  # resident memory when the step was read. /proc/self/statm and the kernel's peak are separate counters that can
  # disagree a little (a fresh python3 here reads 13.93 MB resident against a 13.72 MB peak; CI once read a step
  # above the peak), so a 10% margin; virtual size (gigabytes under XLA) or a unit mix-up would still fail
  rss_mb = [r["host_rss_mb"] for r in records]
  assert all(50 < mb <= 1.1 * peak_mb for mb in rss_mb), (rss_mb, peak_mb)
  tb = EventAccumulator(os.path.join(workdir, "tensorboard"))
  tb.Reload()
  assert [e.value for e in tb.Scalars("loss")] == pytest.approx([r["loss"] for r in records], rel=1e-6)
  assert Checkpointer(os.path.join(workdir, "checkpoints")).all_steps() == [12, 18, 24]
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["model"]["D"] == 32


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_resume_in_the_same_process_is_bit_identical(uninterrupted, data_dir, tmp_path):
  workdir = str(tmp_path)
  loop.run(config(data_dir), workdir, stop_after=12)  # stopped inside the taper, then resumed from the checkpoint
  results = loop.run(config(data_dir), workdir)
  assert losses(workdir) == losses(uninterrupted[0]) and results["resumed_from"] == 12
  assert results["final_val_loss"] == uninterrupted[1]["final_val_loss"]


@pytest.mark.slow  # a training subprocess: nothing in memory survives the stop
@pytest.mark.parametrize("stop", [3, 12], ids=["stop-in-warmup", "stop-in-taper"])
def test_resume_in_a_fresh_process_is_bit_identical(uninterrupted, data_dir, tmp_path, stop):
  workdir = str(tmp_path)
  first = loop.run(config(data_dir), workdir, stop_after=stop)
  assert first["steps"] == stop and not os.path.exists(os.path.join(workdir, "results.json"))
  resume_in_fresh_process(workdir, data_dir)
  assert losses(workdir) == losses(uninterrupted[0])
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["resumed_from"] == stop and results["final_val_loss"] == uninterrupted[1]["final_val_loss"]


def damage_metrics(workdir: str, step: int, torn_last: bool = False) -> None:
  """Changes one digit of step `step`'s loss in metrics.jsonl (the line still parses), and cuts the last line short."""
  path = os.path.join(workdir, "metrics.jsonl")
  with open(path) as f:
    lines = f.readlines()
  record = json.loads(lines[step])
  digits = repr(record["loss"])
  lines[step] = lines[step].replace(digits, digits[:-1] + ("1" if digits[-1] != "1" else "2"))
  assert json.loads(lines[step])["loss"] != record["loss"]
  if torn_last:
    lines[-1] = lines[-1][: len(lines[-1]) // 2]
  with open(path, "w") as f:
    f.writelines(lines)


@pytest.mark.slow  # three short runs
def test_a_damaged_metrics_history_is_cut_back_to_its_last_verified_record_and_said(
  uninterrupted, data_dir, tmp_path, capsys
):
  untimed = lambda workdir: [of_the_run(r) for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  reference = untimed(uninterrupted[0])
  tail = str(tmp_path / "tail")  # damage after the checkpoint resumed from: nothing is lost
  loop.run(config(data_dir), tail, stop_after=15)
  shutil.rmtree(os.path.join(tail, "checkpoints", "15"))  # as if killed while saving step 15: resumes from 12
  damage_metrics(tail, 13, torn_last=True)
  capsys.readouterr()
  results = loop.run(config(data_dir), tail)
  said = capsys.readouterr().out
  assert (
    "metrics.jsonl: line 14 of 15 (after step 12) is damaged (it does not match its checksum); kept the "
    "verified records before it and dropped the rest" in said
  ), said
  assert untimed(tail) == reference and results["resumed_from"] == 12
  middle = str(tmp_path / "middle")  # damage before it: the steps between are said to have no record
  loop.run(config(data_dir), middle, stop_after=12)
  damage_metrics(middle, 5)
  capsys.readouterr()
  loop.run(config(data_dir), middle)
  assert (
    "line 6 of 12 (after step 4) is damaged" in (said := capsys.readouterr().out)
    and "steps 5–11 now have no record" in said
  ), said
  assert untimed(middle) == reference[:5] + reference[12:]


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_checkpoint_moves_between_8_devices_and_1(data_dir, tmp_path):
  cfg = config(data_dir)
  meshes = {"8": sharding.make_mesh(data=2, fsdp=4), "1": sharding.make_mesh(devices=jax.devices()[:1])}
  for src, dst in (("8", "1"), ("1", "8")):
    source, target = Trainer(cfg, meshes[src]), Trainer(cfg, meshes[dst])
    state = source.init_state(0)
    batch = jax.random.randint(jax.random.key(0), (8, 33), 0, 512)
    state, _ = source.train_step(state, jax.device_put(batch, source.batch_sharding))
    ckpt = Checkpointer(str(tmp_path / f"{src}to{dst}"))
    ckpt.save(1, state, {"position": 1})
    ckpt.wait()
    restored, data_state = ckpt.restore(1, target.abstract_state())
    ckpt.close()
    assert data_state == {"position": 1}
    leaf = restored["params"]["block_0"]["mlp"]["wi_0"]
    assert len(leaf.sharding.device_set) == int(dst)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))


@pytest.mark.slow  # two training subprocesses, one SIGKILLed mid-save
def test_a_run_killed_while_saving_resumes_from_the_last_complete_checkpoint(data_dir, tmp_path):
  workdir = str(tmp_path)
  changes = {
    "train.steps": 100_000,
    "taper.taper_end": -1,
    "checkpoint.every": 1,
    "checkpoint.keep": 1000,
    "train.diag_every": 100_000,
  }
  flags = [f"--config.{k}={v}" for k, v in {**TINY, "data.data_dir": data_dir, **changes}.items()]
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "experiments.tinystories",
      "--config=configs/all_taper.py:tuned=0",
      f"--workdir={workdir}",
      *flags,
    ],
    cwd=ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  ckpt_dir = os.path.join(workdir, "checkpoints")
  deadline = time.time() + 300
  while time.time() < deadline and (not os.path.isdir(ckpt_dir) or len(os.listdir(ckpt_dir)) < 6):
    assert proc.poll() is None, "the training process exited before it could be killed"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)  # saves are continuous here, so this lands in or near one
  proc.wait()
  complete = Checkpointer(ckpt_dir).all_steps()
  assert len(complete) >= 3
  results = loop.run(config(data_dir, **changes), workdir, stop_after=complete[-1] + 2)
  assert results["resumed_from"] == complete[-1] and results["steps"] == complete[-1] + 2


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_a_non_finite_loss_stops_the_run_naming_the_step_and_the_last_good_checkpoint(data_dir, tmp_path):
  with pytest.raises(FloatingPointError, match=r"at step \d+; stopping\. Last good checkpoint: step \d+"):
    loop.run(config(data_dir, **{"opt.lr": 1e30, "opt.clip": 1e30, "checkpoint.every": 1}), str(tmp_path))
  ckpt = Checkpointer(str(tmp_path / "checkpoints"))
  cfg = config(data_dir)
  state, _ = ckpt.restore(ckpt.latest_step(), Trainer(cfg, sharding.make_mesh()).abstract_state())
  assert all(bool(np.all(np.isfinite(x))) for x in jax.tree.leaves(jax.device_get(state["params"])))


@pytest.mark.slow  # a second training run
def test_a_run_saved_unrolled_resumes_scanned_with_remat(uninterrupted, data_dir, tmp_path, capsys):
  workdir = str(tmp_path)
  loop.run(config(data_dir, **{"model.scan_layers": "unrolled"}), workdir, stop_after=12)
  loop.run(config(data_dir, **{"model.scan_layers": True, "model.remat": "save_matmuls"}), workdir)  # a former bool
  assert "resuming with model.scan_layers='scanned' (saved with 'unrolled')" in capsys.readouterr().out
  np.testing.assert_allclose(losses(workdir), losses(uninterrupted[0]), rtol=1e-4)
  assert json.load(open(os.path.join(workdir, "config.json")))["model"]["scan_layers"] == "scanned"


@pytest.mark.slow  # a second training run
def test_a_run_saved_scanned_resumes_unrolled_and_loads_per_layer(uninterrupted, data_dir, tmp_path):
  """A scanned run's checkpoints hold its blocks stacked (train/state_layout.py); resumed unrolled, the run goes on
  as if uninterrupted, and a scanned checkpoint loads for inference as the per-layer tree."""
  workdir, unrolled = str(tmp_path), {"model.scan_layers": "unrolled"}
  loop.run(config(data_dir, **{"model.scan_layers": "scanned"}), workdir, stop_after=12)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  assert ckpt.saved_stacked(12)
  loaded, _ = loading.load_checkpoint(workdir)  # two paths to the per-layer tree: inference's and a resume's
  restored, _ = ckpt.restore(12, Trainer(config(data_dir, **unrolled), sharding.make_mesh()).abstract_state())
  assert "block_0" in loaded["params"]
  jax.tree.map(np.testing.assert_array_equal, loaded["params"], jax.device_get(restored["params"]))
  loop.run(config(data_dir, **unrolled), workdir)
  np.testing.assert_allclose(losses(workdir), losses(uninterrupted[0]), rtol=1e-4)


def test_resuming_with_a_different_model_is_refused(uninterrupted, data_dir):
  with pytest.raises(ValueError, match=r"model\.D: saved 32 vs now 48"):
    loop.run(config(data_dir, **{"model.D": 48}), uninterrupted[0])


def test_a_checkpoint_from_before_the_parameter_rename_is_refused_by_name(tmp_path):
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(
    5, {"params": {"final_norm": {"scale": np.ones(2, np.float32)}}, "rng": np.zeros(2, np.uint32)}, {"position": 0}
  )
  ckpt.wait()
  with pytest.raises(ValueError, match=r"step 5 .* tapernorm_jax 0\.1.*gamma/gamma_tilde/beta"):
    ckpt.restore(5, {"params": {"final_norm": {"gamma": np.ones(2, np.float32)}}})
  ckpt.close()


def test_a_checkpoint_records_its_files_and_a_flipped_bit_is_named_before_orbax_reads_it(tmp_path):
  ckpt = Checkpointer(str(tmp_path))
  state = {"w": np.arange(4096, dtype=np.float32)}
  ckpt.save(1, state, {"position": 0})
  ckpt.save(2, {"w": state["w"] + 1}, {"position": 1})  # step 1 is recorded once its save is complete
  assert (tmp_path / "1" / "manifest.json").exists() and not (tmp_path / "2" / "manifest.json").exists()
  ckpt.wait()
  recorded = json.loads((tmp_path / "2" / "manifest.json").read_text())["files"]
  data_files = [name for name in recorded if "/d/" in name]
  assert data_files and all(recorded[n]["size"] == (tmp_path / "2" / n).stat().st_size for n in recorded)
  path = tmp_path / "2" / max(data_files, key=lambda n: recorded[n]["size"])
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0x10
  path.write_bytes(bytes(data))
  target = {"w": jax.numpy.zeros(4096, jax.numpy.float32)}
  with pytest.raises(
    DamagedCheckpointError,
    match=r"step 2 .* is damaged: state/.* does not match the SHA-256 "
    r"manifest.json recorded\. The newest other checkpoint is step 1",
  ):
    ckpt.restore(2, target)
  restored = ckpt.restore_latest(target, fallback=True)
  assert restored.step == 1 and np.array_equal(restored.state["w"], state["w"]) and restored.moved[0][0] == 2
  ckpt.close()


def test_two_checkpointers_in_one_process_save_the_same_steps_side_by_side(tmp_path):
  # The sweep's in-process runner: cells on their own threads, saving the same steps at once. With Orbax's directories
  # created in the background, one manager took the other's completion signal and wrote into a directory not yet
  # there (FileNotFoundError in each of 3 runs of this test without the fix).
  errors, steps = [], 20

  def cell(k: int) -> None:
    ckpt = Checkpointer(str(tmp_path / f"cell{k}"), keep=100)
    try:
      for step in range(steps):
        ckpt.save(step, {"w": np.full(4096, k + step, np.float32)}, {"position": step})
      ckpt.close()
    except Exception as e:  # noqa: BLE001 (reported below)
      errors.append(e)

  threads = [threading.Thread(target=cell, args=(k,)) for k in range(2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors, errors
  for k in range(2):
    ckpt = Checkpointer(str(tmp_path / f"cell{k}"))
    assert ckpt.all_steps() == list(range(steps))
    state, data_state = ckpt.restore(steps - 1, {"w": jax.numpy.zeros(4096, jax.numpy.float32)})
    assert float(state["w"][0]) == k + steps - 1 and data_state == {"position": steps - 1}
