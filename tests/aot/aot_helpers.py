"""Shared by the compile-check tests: small run configs and an independent count of what FSDP leaves each device."""

import importlib.util

import flax.linen as nn
import numpy as np
import pytest
from flax import traverse_util

from tapernorm_jax.aot import topology
from tapernorm_jax.model import abstract_variables
from tapernorm_jax.train import run_config

needs_libtpu = pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None, reason=f"the TPU compiler is not installed: {topology.INSTALL}"
)


def small_config(fsdp: int, batch: int, **model):
  """An all_taper run of a small model (the cpu preset's, with `model` fields changed) over `fsdp` ways."""
  cfg = run_config.get_config("all_taper", "size=cpu")
  cfg.model.update(model)
  cfg.train.batch_size, cfg.mesh.fsdp = batch, fsdp
  return cfg


def state_bytes_per_device(cfg, fsdp: int, devices: int) -> int:
  """Parameters, both Adam moments and the calibration state as FSDP lays them out: leaves with an `embed` axis
  split fsdp ways, the rest whole; plus three int32 step counters (the run's, Adam's, the learning-rate
  schedule's) and this device's rows of the batch."""
  boxed = abstract_variables(cfg.model)
  axes = traverse_util.flatten_dict(nn.get_partition_spec(boxed))
  total = 0
  for path, leaf in traverse_util.flatten_dict(nn.unbox(boxed)).items():
    size = int(np.prod(leaf.shape)) * leaf.dtype.itemsize // (fsdp if "embed" in tuple(axes[path] or ()) else 1)
    total += size * (3 if path[0] == "params" else 1)
  return total + 3 * 4 + cfg.train.batch_size * (cfg.model.T + 1) * 4 // devices
