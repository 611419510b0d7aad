"""Every config file loads, in every size and aux setting, and builds its model."""

import importlib
import pathlib

import jax
import pytest

from tapernorm_jax.model import ModelConfig, init

CONFIGS = sorted(p.stem for p in pathlib.Path(__file__).parent.parent.joinpath("configs").glob("*.py")
                 if p.stem not in ("__init__", "base", "gpt2"))  # gpt2.py takes model=, method= (test_gpt2_finetune)


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


@pytest.mark.parametrize("arg,problem", [("size=2m", "size"), ("aux=maybe", "aux"), ("seed=x", "seed"),
                                         ("lr=3", "lr"), ("size", "key=value")])
def test_bad_variant_arguments_are_named(arg, problem):
  with pytest.raises(ValueError, match=problem):
    importlib.import_module("configs.all_taper").get_config(arg)
