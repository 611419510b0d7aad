"""Fault injection, exports: `experiments.generate --export_dir` killed with SIGKILL at seeded stages of writing the
export (its Orbax copy, its safetensors copy, its tokenizer) and run again with the same command writes the export an
uninterrupted run writes; a killed export never counts as one (it has no config.json), and nothing in it is
half-written under its own name. TAPERNORM_FAULT_SEED picks other stages."""

import os
import sys

import jax
import numpy as np
import pytest

import kills
from tapernorm_jax.inference import export

STAGES = (export.VARIABLES_DIR, export.SAFETENSORS_FILE, export.TOKENIZER_DIR)  # in the order `export.save` writes
MODEL = {"model.D": 256, "model.H": 4, "model.L": 4, "model.T": 32, "model.V": 512}  # 14 MB: a kill lands mid-copy
ENV = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0"}


def writing(out: str, stage: str):
  """True once the export in `out` is writing (or wrote) `stage`."""
  return lambda: os.path.isdir(out) and any(name.startswith(stage) for name in os.listdir(out))


@pytest.mark.slow  # a training run and five exports
def test_an_export_killed_anywhere_is_written_again_whole(tmp_path):
  run = str(tmp_path / "run")
  kills.run(
    [
      sys.executable,
      "-m",
      "experiments.tinystories",
      "--config=configs/all_taper.py",
      f"--workdir={run}",
      *(
        f"--config.{k}={v}"
        for k, v in {
          **MODEL,
          "train.steps": 4,
          "train.batch_size": 4,
          "train.eval_batches": 1,
          "checkpoint.every": 4,
          "taper.taper_end": 3,
          "taper.gate_warmup_frac": 0.25,
          "data.data_dir": tmp_path / "data",
          "data.synthetic_train_stories": 200,
          "data.synthetic_valid_stories": 30,
        }.items()
      ),
    ],
    env=ENV,
  )
  generate = [sys.executable, "-m", "experiments.generate", f"--workdir={run}", "--tokens=1", "--max_new_tokens=1"]
  reference, out = str(tmp_path / "reference"), str(tmp_path / "killed")
  kills.run([*generate, f"--export_dir={reference}"], env=ENV)
  draw = kills.rng("export")
  history = []
  for stage in sorted((draw.choice(STAGES) for _ in range(3)), key=STAGES.index):
    proc = kills.start([*generate, f"--export_dir={out}"], env=ENV)
    history.append(kills.kill_when(proc, writing(out, stage), f"writing {stage}"))
    kills.check_whole(out)
    if export.is_export(out):  # the kill came after the export was complete: it is whole (checked above)
      break
  where = f"seed {kills.SEED}: {'; '.join(history)}"
  assert history[0].startswith("killed"), where
  if not export.is_export(out):
    kills.run([*generate, f"--export_dir={out}"], env=ENV)
  kills.check_whole(out)
  expected = export.load(reference)
  for source in ("orbax", "safetensors"):
    got = export.load(out, source)
    assert got.info == expected.info and got.model_cfg == expected.model_cfg, where
    assert jax.tree.structure(got.variables) == jax.tree.structure(expected.variables), where
    jax.tree.map(np.testing.assert_array_equal, got.variables, expected.variables)
  with (
    open(os.path.join(reference, export.SAFETENSORS_FILE), "rb") as f,
    open(os.path.join(out, export.SAFETENSORS_FILE), "rb") as g,
  ):
    assert f.read() == g.read(), where
