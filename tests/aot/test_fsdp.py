"""What each device computes and holds under FSDP and under data parallelism, from the compiler's own figures on the
fake CPU devices: the products per device are the analytic count divided by the device count on both meshes, FSDP
holds 1/fsdp of the parameters and optimiser state (counted here from the model's own shapes and axes), and the
temporaries per device fall as the same batch is split over more devices."""

import jax
import pytest

from tapernorm_jax.runtime import costs
from tapernorm_jax.aot import analysis, programs
from tapernorm_jax.model import sharding
from tapernorm_jax.train.trainer import Trainer
from aot_helpers import small_config, state_bytes_per_device

B, T = 16, 64


def config(fsdp: int):
  """A small all_taper run whose batch splits over up to 8 devices (xla attention: every product visible)."""
  return small_config(fsdp, B, T=T, D=64, L=2, attention_impl="xla")


def train_step(devices: int, fsdp: int) -> tuple[Trainer, analysis.Figures]:
  """The trainer over the first `devices` devices and its compiled train step's figures."""
  if jax.device_count() < devices:
    pytest.skip(f"needs {devices} devices (conftest.py gives 8 fake CPU devices)")
  trainer = Trainer(config(fsdp), sharding.make_mesh(-1, fsdp, jax.devices()[:devices]))
  return trainer, analysis.compile_program(programs.training(trainer)[0], None, [0] * devices)


@pytest.mark.parametrize("fsdp", [8, 1])
def test_each_device_computes_its_share_of_the_analytic_flops(fsdp):
  trainer, figures = train_step(8, fsdp)
  params = programs.matmul_params(trainer.abstract_state()["params"], trainer.model_cfg)
  analytic = costs.train_flops_per_token(params, 2, 64, T) * B * T / 8
  assert figures.flops == pytest.approx(analytic, rel=0.1)


def test_fsdp_holds_its_share_of_the_state_and_data_parallelism_all_of_it():
  _, sharded = train_step(8, 8)
  _, replicated = train_step(8, 1)
  assert sharded.memory["argument"] == state_bytes_per_device(config(8), 8, 8)
  assert replicated.memory["argument"] == state_bytes_per_device(config(1), 1, 8)
  assert sharded.memory["argument"] < replicated.memory["argument"] / 4


@pytest.mark.parametrize("fsdp", [1, 2])
def test_temporaries_per_device_fall_as_the_batch_is_split_over_more_devices(fsdp):
  _, two = train_step(2, fsdp)
  _, eight = train_step(8, fsdp)
  assert eight.memory["temp"] < two.memory["temp"] / 2
