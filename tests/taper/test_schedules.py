"""LR and gate schedules against their closed forms."""

import math

import numpy as np

from tapernorm_jax.taper import schedules

PH = schedules.Phases(steps=100, lr_warmup=10, taper_start=20, taper_end=80)


def test_gate_is_one_then_half_cosine_then_zero():
  for k in (0, 5, 19, 20):
    assert float(schedules.gate(k, PH)) == 1.0
  for k in (21, 35, 50, 79):
    np.testing.assert_allclose(schedules.gate(k, PH), 0.5 * (1 + math.cos(math.pi * (k - 20) / 60)), atol=1e-7)
  for k in (80, 81, 99, 1000):
    assert float(schedules.gate(k, PH)) == 0.0


def test_lr_warms_up_linearly_then_cosine_to_zero():
  lr = schedules.learning_rate(1e-3, PH)
  np.testing.assert_allclose(lr(5), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(lr(10), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(lr(55), 1e-3 * 0.5 * (1 + math.cos(math.pi * 45 / 90)), rtol=1e-5)
  assert float(lr(100)) == 0.0


def test_phases_from_config_resolve_fractions_and_the_last_step():
  from configs import base

  cfg = base.get_config("all_taper", "size=1m")
  ph = schedules.Phases.from_config(cfg)
  assert (ph.steps, ph.lr_warmup, ph.taper_start, ph.taper_end) == (500_000, 25_000, 25_000, 499_999)


def test_calibration_waits_for_its_floor_where_the_run_is_long_enough():
  from configs import base

  # 300 steps: 5% would calibrate at step 15, before h has settled
  cfg = base.get_config("all_taper", "size=cpu,tuned=0")
  assert cfg.train.steps == 300 and cfg.taper.min_calibration_step == 100
  assert schedules.Phases.from_config(cfg).taper_start == 100
  for steps, frac, want in ((199, 0.05, 10), (200, 0.05, 100), (4000, 0.05, 200), (300, 0.5, 150)):
    cfg.train.steps, cfg.taper.gate_warmup_frac = steps, frac  # too short for the floor: the fraction (warned)
    assert schedules.Phases.from_config(cfg).taper_start == want, (steps, frac)
  cfg.train.steps, cfg.taper.gate_warmup_frac, cfg.taper.taper_end = 300, 0.05, 80  # the floor past the taper end
  assert schedules.Phases.from_config(cfg).taper_start == 15
  cfg.taper.taper_end, cfg.taper.min_calibration_step = -1, 0  # off: the fraction alone, as a fine-tune sets it
  assert schedules.Phases.from_config(cfg).taper_start == 15
