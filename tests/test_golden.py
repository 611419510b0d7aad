"""Golden metrics: a fixed tiny run's first steps equal committed values, so a refactor that changes the init,
the loss, the schedules or the calibration fails here.

Regenerate (only for an intended change of behaviour, and say why in the commit):
    GOLDEN_UPDATE=1 ./dev.sh test tests/test_golden.py
"""

import json
import os

import jax
import numpy as np
import pytest

from configs import base
from tapernorm_jax.model import param_paths, sharding
from tapernorm_jax.taper import calibration
from tapernorm_jax.train.trainer import Trainer
from locations import FIXTURES

FIXTURE = os.path.join(FIXTURES, "golden.json")
STEPS = 3


def golden_run() -> dict:
  """3 all_taper steps from seed 0 on fixed random batches: calibration after step 0, the gate moving after."""
  cfg = base.override(
    base.get_config("all_taper", "tuned=0"),  # the defaults the fixture was made at, whatever the presets become
    {
      "model.D": 32,
      "model.H": 4,
      "model.L": 2,
      "model.T": 16,
      "model.V": 64,
      "train.steps": 4,
      "train.batch_size": 8,
      "taper.gate_warmup_frac": 0.25,
      "taper.taper_end": 3,
      "opt.lr": 1e-2,
    },
  )
  trainer = Trainer(cfg, sharding.make_mesh(devices=jax.devices()[:1]))
  state = trainer.init_state(0)
  keys = jax.random.split(jax.random.key(42), STEPS)
  records = []
  for k in range(STEPS):
    batch = jax.random.randint(keys[k], (8, 17), 0, 64)
    state, m = trainer.train_step(state, batch)
    records.append({name: float(m[name]) for name in ("loss", "ce", "scale_loss", "gate", "lr", "grad_norm")})
  c = calibration.norm_scalars(state["calib"], trainer.method.norms, param_paths.C)
  return {
    "steps": records,
    "c": {k: float(v) for k, v in c.items()},
    "s_tgt": float(calibration.s_target(state["calib"])),
  }


def test_three_steps_match_the_committed_golden_values():
  got = golden_run()
  if os.environ.get("GOLDEN_UPDATE"):
    with open(FIXTURE, "w") as f:
      json.dump(got, f, indent=2, sort_keys=True)
    pytest.skip(f"wrote {FIXTURE}")
  with open(FIXTURE) as f:
    want = json.load(f)
  assert set(got["c"]) == set(want["c"]) and len(got["c"]) == 5  # 2 blocks × 2 norms + the final norm
  for k, (g, w) in enumerate(zip(got["steps"], want["steps"])):
    for name in w:
      np.testing.assert_allclose(g[name], w[name], rtol=2e-5, atol=1e-7, err_msg=f"step {k} {name}")
  for path in want["c"]:
    np.testing.assert_allclose(got["c"][path], want["c"][path], rtol=2e-5, err_msg=f"c of {path}")
  np.testing.assert_allclose(got["s_tgt"], want["s_tgt"], rtol=2e-5)
