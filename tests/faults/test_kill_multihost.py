"""Fault injection, several processes: a 2-process run (every parameter sharded across both, as on a pod) whose
processes are all killed with SIGKILL at seeded points (at startup, during a step, during a checkpoint save, which
both processes write) and started again each time ends with the uninterrupted 2-process run's losses, bit for bit,
with nothing half-written. TAPERNORM_FAULT_SEED picks other points."""

import pytest

import kills
from multihost import MESHES, finish, prepare_shared, start

STEPS, EVERY = 24, 6
CHANGES = {"train.steps": STEPS, "checkpoint.every": EVERY, "checkpoint.keep": 100, "taper.taper_end": 18}


@pytest.mark.slow  # five 2-process runs
def test_a_two_process_run_killed_anywhere_ends_as_if_it_never_was(tmp_path_factory, tmp_path):
  shared, mesh = prepare_shared(tmp_path_factory), MESHES["fsdp"]
  reference, killed = str(tmp_path / "reference"), str(tmp_path / "killed")
  finish(start(2, shared, reference, mesh, str(tmp_path / "record0"), changes=CHANGES))
  history = []
  for i, (kind, step) in enumerate(kills.training_points("multihost", STEPS, EVERY, count=2)):
    run = start(2, shared, killed, mesh, str(tmp_path / f"record{i + 1}"), changes=CHANGES)
    history.append(kills.kill_when(run.procs, kills.training_ready([killed], kind, step, EVERY), f"{kind} {step}"))
    kills.check_whole(killed)
  finish(start(2, shared, killed, mesh, str(tmp_path / "record_last"), changes=CHANGES))
  kills.check_whole(killed)
  kills.check_same_ending(reference, killed, STEPS, history)
