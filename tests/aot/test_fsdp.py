"""What each device computes and holds under FSDP and under data parallelism, from the compiler's own figures on the
fake CPU devices: the products per device are the analytic count divided by the device count on both meshes, FSDP
holds 1/fsdp of the parameters and optimiser state (counted here from the model's own shapes and axes), and the
temporaries per device fall as the same batch is split over more devices; scanned layers gather one layer's weights
per trip of their loop."""

import jax
import pytest

from tapernorm_jax.runtime import costs
from tapernorm_jax.aot import analysis, hlo, programs
from tapernorm_jax.model import sharding
from tapernorm_jax.train.trainer import Trainer
from aot_helpers import small_config, state_bytes_per_device

B, T = 16, 64


def config(fsdp: int, **model):
  """A small all_taper run whose batch splits over up to 8 devices (xla attention: every product visible)."""
  return small_config(fsdp, B, **{"T": T, "D": 64, "L": 2, "attention_impl": "xla", **model})


def train_step(devices: int, fsdp: int, **model) -> tuple[Trainer, analysis.Figures]:
  """The trainer over the first `devices` devices and its compiled train step's figures."""
  if jax.device_count() < devices:
    pytest.skip(f"needs {devices} devices (conftest.py gives 8 fake CPU devices)")
  trainer = Trainer(config(fsdp, **model), sharding.make_mesh(-1, fsdp, jax.devices()[:devices]))
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


def test_scanned_layers_gather_one_layer_at_a_time_and_compute_the_same_products():
  """The scanned step (three blocks, one body) gathers arrays of exactly the shapes the unrolled step gathers — one
  layer's weights per trip, never a stack of three — and each device computes the same products (every trip
  counted)."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (conftest.py gives 8 fake CPU devices)")
  gathered, flops = {}, {}
  for scan in (False, True):
    trainer = Trainer(
      config(8, L=3, scan_layers="scanned" if scan else "unrolled"), sharding.make_mesh(-1, 8, jax.devices()[:8])
    )
    module = hlo.parse(programs.training(trainer)[0].lower().compile().as_text())
    shapes = {i.shape for body in module.computations.values() for i in body if i.opcode == "all-gather"}
    gathered[scan] = {tuple(hlo.dims(shape)) for shape in shapes}
    flops[scan] = hlo.product_flops(module, hlo.Counts.of(module).runs)
  assert gathered[True] == gathered[False]
  assert flops[True] == pytest.approx(flops[False], rel=1e-3)
