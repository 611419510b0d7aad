"""Every config file loads, in every size and aux setting, and builds its model."""

import importlib

import jax
import pytest

from tapernorm_jax.model import ModelConfig, init
from tapernorm_jax.taper import variants
from tapernorm_jax.train import run_config
from locations import ROOT, run_without_checkout

CONFIGS = sorted(
  p.stem for p in ROOT.joinpath("configs").glob("*.py") if p.stem not in ("__init__", "base", "gpt2")
)  # gpt2.py takes model=, variant= (test_gpt2_finetune)


def test_the_four_paper_variants_exist():
  assert {"baseline", "internal_taper", "final_taper", "all_taper"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("arg", [None, "size=1m", "size=30m,aux=0,seed=3", "size=9m,aux=1"])
def test_config_builds_its_model(name, arg):
  cfg = importlib.import_module(f"configs.{name}").get_config(arg)
  model_cfg = ModelConfig.from_config(cfg.model)
  shapes = jax.eval_shape(lambda: init(model_cfg, jax.random.key(0)))
  assert shapes["params"]["embed"].value.shape == (cfg.model.V, cfg.model.D)
  assert cfg.data.vocab_size == cfg.model.V


def test_the_cpu_ladder_trains_offline_and_spans_a_decade_of_parameters():
  ladder = [size for size, shape in variants.SIZES.items() if shape.get("cpu_scale")]
  counts = []
  for size in ladder:
    cfg = run_config.get_config("baseline", f"size={size}")
    model_cfg = ModelConfig.from_config(cfg.model)
    assert (cfg.data.source, cfg.model.V, cfg.model.T, cfg.train.steps) == ("synthetic", 2_000, 128, 300)
    assert model_cfg.D % model_cfg.H == 0 and model_cfg.D // model_cfg.H >= 4  # RoPE pairs in every head
    shapes = jax.eval_shape(lambda: init(model_cfg, jax.random.key(0)))
    counts.append(sum(x.value.size for x in jax.tree.leaves(shapes["params"], is_leaf=lambda x: hasattr(x, "value"))))
  assert len(ladder) >= 4 and counts == sorted(counts) and counts[-1] / counts[0] > 10  # in SIZES order, 89K-934K
  assert run_config.get_config("baseline", "size=1m").data.source == "tinystories"


@pytest.mark.parametrize(
  "arg,problem", [("size=2m", "size"), ("aux=maybe", "aux"), ("seed=x", "seed"), ("lr=3", "lr"), ("size", "key=value")]
)
def test_bad_variant_arguments_are_named(arg, problem):
  with pytest.raises(ValueError, match=problem):
    importlib.import_module("configs.all_taper").get_config(arg)


def test_the_library_builds_configs_without_the_configs_package(tmp_path):
  # As from an installed wheel used outside a checkout: `configs` cannot be imported (sys.modules[...] = None makes
  # every import of it fail), and the modules that need the paper's sizes and variants still import and work.
  script = (
    "import tapernorm_jax.studies.analysis.report, tapernorm_jax.studies.launch.runner, "
    "tapernorm_jax.studies.launch.cell, "
    "tapernorm_jax.benchmarks.decode, tapernorm_jax.benchmarks.train\n"
    "from tapernorm_jax.train import run_config\n"
    "print(run_config.get_config('all_taper', 'size=9m').model.D)"
  )
  done = run_without_checkout(script, tmp_path)
  assert done.stdout.split()[-1] == "256"  # the paper's 9M width


def test_configs_base_is_the_library_s_defaults():
  from configs import base

  assert base.get_config is run_config.get_config and base.SIZES is variants.SIZES
