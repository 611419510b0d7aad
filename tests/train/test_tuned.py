"""The tuned presets (train/tuned.py): a method's chosen setting applied at the sizes the tuning study tuned, the
defaults elsewhere and with tuned=0, and a presets file that names a field no config has is one error naming it."""

import json

import pytest

from configs.sweeps import cpu_mini, ladder, tuning
from tapernorm_jax.studies import spec
from tapernorm_jax.studies.launch import grid
from tapernorm_jax.train import run_config, tuned

CHOSEN = {
  "dyt:aux=0": {
    "cpu": {
      "tag": "lr0.01_alpha25x",
      "overrides": {"opt.lr": 0.01, "model.norm_alpha": [20.0, 5.0, 5.0]},
      "tune_loss": 2.1,
      "seeds": 1,
    },
    "cpu_l": None,  # no setting trained there: the defaults
  },
  "baseline:aux=1": {
    "cpu": {
      "tag": "lr0.001_gain3",
      "overrides": {"opt.lr": 0.001, "model.norm_gain_init": 3.0},
      "tune_loss": 1.9,
      "seeds": 1,
    }
  },
}


@pytest.fixture
def presets_file(tmp_path, monkeypatch):
  path = tmp_path / "tuned.json"
  path.write_text(json.dumps(CHOSEN))
  monkeypatch.setattr(tuned, "TUNED_FILE", str(path))
  return path


def test_a_tuned_method_gets_its_chosen_setting_at_its_size_and_the_defaults_elsewhere(presets_file):
  default = run_config.get_config("dyt", "size=cpu,tuned=0")
  assert (default.tuned, default.opt.lr, tuple(default.model.norm_alpha)) == ("", 3e-3, ())
  cfg = run_config.get_config("dyt", "size=cpu")
  assert (cfg.tuned, cfg.opt.lr, tuple(cfg.model.norm_alpha)) == ("lr0.01_alpha25x", 0.01, (20.0, 5.0, 5.0))
  for arg in ("size=cpu_l", "size=cpu_xs", "size=cpu,aux=1"):  # none chosen; not tuned; another method (aux)
    other = run_config.get_config("dyt", arg)
    assert (other.tuned, other.opt.lr) == ("", 3e-3)
  baseline = run_config.get_config("baseline", "size=cpu,aux=1,seed=2")
  assert (baseline.tuned, baseline.opt.lr, baseline.model.norm_gain_init, baseline.seed) == (
    "lr0.001_gain3",
    1e-3,
    3.0,
    2,
  )
  assert run_config.get_config("baseline", "size=cpu").tuned == ""  # the baseline without aux was tuned apart


def test_a_bad_tuned_argument_and_a_presets_file_naming_no_field_are_one_error_each(presets_file):
  with pytest.raises(ValueError, match=r"tuned='maybe': use tuned=1 .* or tuned=0"):
    run_config.get_config("dyt", "size=cpu,tuned=maybe")
  presets_file.write_text(json.dumps({"dyt:aux=0": {"cpu": {"tag": "t", "overrides": {"opt.lrate": 0.01}}}}))
  tuned.presets.cache_clear()
  with pytest.raises(
    ValueError, match=r"tuned.json, dyt:aux=0 at cpu: config field 'opt.lrate' does not exist.*'opt.lr'"
  ):
    run_config.get_config("dyt", "size=cpu")
  tuned.presets.cache_clear()


def test_every_committed_preset_applies_to_its_method_and_size():
  tuned.presets.cache_clear()
  for method, sizes in tuned.presets(tuned.TUNED_FILE).items():
    variant, aux = method.split(":aux=")
    for size, entry in sizes.items():
      if entry:
        cfg = run_config.get_config(variant, f"size={size},aux={aux}")
        assert cfg.tuned == entry["tag"] and cfg.opt.lr == entry["overrides"].get("opt.lr", cfg.opt.lr)


def test_a_study_cell_gets_the_preset_at_its_sizes_own_steps_and_the_defaults_under_a_token_budget(presets_file):
  own = grid.cell_config(spec.Cell("dyt", "cpu", 0, 0))
  budget = grid.cell_config(spec.Cell("dyt", "cpu", 0, 0, budget="tpp5"))
  assert (own.tuned, own.opt.lr) == ("lr0.01_alpha25x", 0.01)
  assert (budget.tuned, budget.opt.lr, tuple(budget.model.norm_alpha)) == ("", 3e-3, ())


def test_a_sweep_or_grid_with_tuned_false_trains_its_cells_at_the_defaults(presets_file):
  sweep = {"name": "s", "seeds": [0], "tuned": False, "grids": [{"variants": ["dyt"], "sizes": ["cpu"]}]}
  (cell,) = grid.expand(sweep)
  assert not cell.tuned and spec.Cell.from_json(cell.to_json()) == cell
  assert (grid.cell_config(cell).tuned, grid.cell_config(cell).opt.lr) == ("", 3e-3)
  sweep["grids"][0]["tuned"] = True  # a grid's own field wins over the sweep's
  (cell,) = grid.expand(sweep)
  assert "tuned" not in cell.to_json() and grid.cell_config(cell).tuned == "lr0.01_alpha25x"
  sweep["grids"][0]["tuned"] = "no"
  with pytest.raises(spec.SweepError, match=r"grids\[0\]\.tuned='no': True .* or False"):
    grid.expand(sweep)
  for module in (tuning, ladder, cpu_mini):  # the studies that compare at one protocol, not at each method's best
    assert not any(c.tuned for c in grid.expand(module.get_config())), module.__name__
