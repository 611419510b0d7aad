"""Fault injection, training: a TinyStories run and a GPT-2 fine-tune with gradient accumulation, each killed with
SIGKILL at seeded points across its life (at startup, during a step, during a checkpoint save) and started again
after each kill with the same command, end exactly as the uninterrupted run does, with no half-written file anywhere
(kills.check_whole after every kill). TAPERNORM_FAULT_SEED picks other points."""

import os
import sys

import pytest

import kills

STEPS, EVERY = 36, 6
SMALL = {
  "model.D": 32,
  "model.H": 4,
  "model.L": 2,
  "model.T": 32,
  "model.V": 512,
  "train.batch_size": 8,
  "train.log_every": 4,
  "train.diag_every": 8,
  "train.eval_batches": 2,
  "checkpoint.keep": 100,
  "data.synthetic_train_stories": 400,
  "data.synthetic_valid_stories": 60,
}
RUN = {**SMALL, "train.steps": STEPS, "checkpoint.every": EVERY, "taper.taper_end": 28}
ENV = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}  # 5x faster compiles; every run alike


def flags(changes: dict) -> list[str]:
  return [f"--config.{k}={v}" for k, v in changes.items()]


def kill_and_resume(name: str, cmd: list[str], reference: str, killed: str) -> None:
  """Runs `cmd` into `reference` whole, then into `killed` with a SIGKILL at each of this test's seeded points and
  once more to the end; the two must agree bit for bit, and nothing may be half-written after any kill."""
  kills.run([*cmd, f"--workdir={reference}"], env=ENV)
  history = []
  for kind, step in kills.training_points(name, STEPS, EVERY):
    proc = kills.start([*cmd, f"--workdir={killed}"], env=ENV)
    history.append(kills.kill_when(proc, kills.training_ready([killed], kind, step, EVERY), f"{kind} {step}"))
    kills.check_whole(killed)
  kills.run([*cmd, f"--workdir={killed}"], env=ENV)
  kills.check_whole(killed)
  kills.check_same_ending(reference, killed, STEPS, history)


@pytest.mark.slow  # four training processes
def test_a_tinystories_run_killed_anywhere_ends_as_if_it_never_was(tmp_path):
  cmd = [
    sys.executable,
    "-m",
    "experiments.tinystories",
    "--config=configs/all_taper.py",
    *flags({**RUN, "data.data_dir": tmp_path / "data", "taper.gate_warmup_frac": 0.25, "opt.lr": 1e-3}),
  ]
  kill_and_resume("tinystories", cmd, str(tmp_path / "reference"), str(tmp_path / "killed"))


@pytest.mark.slow  # five training processes
def test_a_gpt2_fine_tune_with_accumulation_killed_anywhere_ends_as_if_it_never_was(tmp_path):
  data = {"data.data_dir": tmp_path / "data"}
  pretrain = {**SMALL, **data, "train.steps": 8, "taper.taper_end": 4}
  gpt2 = [sys.executable, "-m", "experiments.gpt2_finetune"]
  kills.run(
    [
      *gpt2,
      "--config=configs/gpt2.py:model=demo,variant=baseline,pretrain=1",
      f"--workdir={tmp_path / 'pretrain'}",
      *flags(pretrain),
    ],
    env=ENV,
  )
  fine_tune = {**RUN, **data, "init_from": tmp_path / "pretrain" / "hf", "train.microbatches": 2}
  cmd = [*gpt2, "--config=configs/gpt2.py:model=demo,variant=internal_taper", *flags(fine_tune)]
  kill_and_resume("gpt2", cmd, str(tmp_path / "reference"), str(tmp_path / "killed"))
