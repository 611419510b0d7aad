"""Old names still load, each with one deprecation message naming the old and the new: config fields and values on
disk and on the command line, the GPT-2 config's arguments, norm modes; in tests such a message is an error."""

import json

import pytest

from configs import gpt2
from tapernorm_jax import config_fields
from tapernorm_jax.cli import flags as cli_flags
from tapernorm_jax.errors import TaperNormDeprecationWarning, deprecated
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.train import run_config


def test_an_old_field_in_overrides_sets_the_new_one():
  with pytest.warns(TaperNormDeprecationWarning, match="'taper.fast_path' is now 'train.fixed_step'"):
    cfg = run_config.override(run_config.get_config("all_taper"), {"taper.fast_path": False})
  assert cfg.train.fixed_step is False and "fast_path" not in cfg.taper


def test_the_lost_process_timeout_reads_under_its_old_name():
  """`mesh.peer_timeout_s` became `mesh.process_timeout_s` ('peer' is the PyTorch benchmark's contender)."""
  with pytest.warns(TaperNormDeprecationWarning, match="'mesh.peer_timeout_s' is now 'mesh.process_timeout_s'"):
    cfg = run_config.override(run_config.get_config("all_taper"), {"mesh.peer_timeout_s": 7})
  assert cfg.mesh.process_timeout_s == 7 and "peer_timeout_s" not in cfg.mesh
  with pytest.warns(TaperNormDeprecationWarning):
    assert config_fields.upgrade({"mesh": {"peer_timeout_s": 9}}) == {"mesh": {"process_timeout_s": 9}}


def test_an_old_config_on_disk_reads_with_today_s_names():
  old = {"variant": "vanilla", "size": "s", "taper": {"mu": 0.1, "fast_path": False}, "train": {"steps": 300}}
  with pytest.warns(TaperNormDeprecationWarning) as caught:
    new = config_fields.upgrade(old)
  assert new == {"variant": "baseline", "size": "s", "taper": {"mu": 0.1}, "train": {"steps": 300, "fixed_step": False}}
  assert old["taper"]["fast_path"] is False  # the dict read from disk is left as it was
  assert {str(w.message).split(" is now")[0] for w in caught} == {"config field 'taper.fast_path'", "variant='vanilla'"}


def test_an_old_override_on_the_command_line_is_rewritten():
  argv = [
    "prog",
    "--config=configs/baseline.py",
    "--config.taper.fast_path=False",
    "--noconfig.taper.fast_path",
    "--config.train.steps=3",
  ]
  with pytest.warns(TaperNormDeprecationWarning):
    cli_flags.rename_overrides(argv, "config")
  assert argv[2:] == ["--config.train.fixed_step=False", "--noconfig.train.fixed_step", "--config.train.steps=3"]


def test_gpt2_s_old_argument_and_variant_name():
  with pytest.warns(TaperNormDeprecationWarning) as caught:
    old = gpt2.get_config("model=demo,method=vanilla")
  assert len(caught) == 2  # method= → variant=, vanilla → baseline
  assert old.to_dict() == gpt2.get_config("model=demo,variant=baseline").to_dict()


def test_a_renamed_norm_mode_loads_as_the_new_one():
  with pytest.warns(TaperNormDeprecationWarning, match="model.internal_norm='scale' is now called 'fixed'"):
    cfg = ModelConfig(internal_norm="scale")
  assert cfg.internal_norm == "fixed"


def test_the_project_s_own_deprecations_fail_tests():
  with pytest.raises(TaperNormDeprecationWarning, match="an old name"):
    deprecated("an old name")


def test_a_fakeln_run_written_before_the_scale_loss_rename_reads_with_its_own_lambda(tmp_path):
  # Before the rename results.json recorded taper.aux_weight for every run, so a FakeLN run with its scale loss on
  # read as aux=0; its config.json holds the λ its method used, which is what the study rows now read.
  from tapernorm_jax.studies.analysis import run_rows  # noqa: PLC0415

  run_dir = tmp_path / "fakeln-s-aux1-seed0"
  run_dir.mkdir()
  (run_dir / "config.json").write_text(
    json.dumps(
      {
        "variant": "fakeln",
        "size": "s",
        "seed": 0,
        "method": "fakeln",
        "taper": {"aux_weight": 0.0},
        "fakeln": {"aux_weight": 0.1},
      }
    )
  )
  (run_dir / "results.json").write_text(
    json.dumps(
      {"variant": "fakeln", "size": "s", "seed": 0, "aux_weight": 0.0, "final_val_loss": 3.0, "complete": True}
    )
  )
  with pytest.warns(TaperNormDeprecationWarning) as caught:
    run = run_rows.read_run(str(run_dir))
  assert {str(w.message).split(" is now")[0] for w in caught} == {
    "config field 'taper.aux_weight'",
    "config field 'fakeln.aux_weight'",
  }
  assert run.aux == 1
  with pytest.warns(TaperNormDeprecationWarning, match="'taper.aux_weight' is now 'taper.scale_loss_weight'"):
    cfg = run_config.override(run_config.get_config("all_taper"), {"taper.aux_weight": 0.0})
  assert cfg.taper.scale_loss_weight == 0.0 and "aux_weight" not in cfg.taper
