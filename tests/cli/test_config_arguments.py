"""The arguments of a config flag are split once into ConfigArguments: the config file (`--config=FILE`, `--config
FILE`, one dash or two) and the overrides (`--config.x.y=V`, `--config.x.y V`, `--noconfig.x.y`)."""

import pytest

from tapernorm_jax.cli.flags import ConfigArgument, config_arguments, rename_overrides
from tapernorm_jax.errors import TaperNormDeprecationWarning


@pytest.mark.parametrize(
  "argv, expected",
  [
    (["prog", "--config=f.py"], [ConfigArgument(1, "config", None, "f.py")]),
    (["prog", "--config", "f.py"], [ConfigArgument(1, "config", None, "f.py")]),
    (["prog", "-config=f.py"], [ConfigArgument(1, "config", None, "f.py", dashes="-")]),
    (["prog", "--config=f.py:size=cpu"], [ConfigArgument(1, "config", None, "f.py:size=cpu")]),
    (["prog", "--config="], [ConfigArgument(1, "config", None, "")]),
    (["prog", "--config"], [ConfigArgument(1, "config", None, None)]),
    (["prog", "--config.train.steps=5"], [ConfigArgument(1, "config", "train.steps", "5")]),
    (["prog", "--config.train.steps", "5"], [ConfigArgument(1, "config", "train.steps", None)]),
    (["prog", "-config.train.steps=5"], [ConfigArgument(1, "config", "train.steps", "5", dashes="-")]),
    (["prog", "--noconfig.train.flag"], [ConfigArgument(1, "config", "train.flag", None, negated=True)]),
    (["prog", "--config.train.stepz:x=1"], [ConfigArgument(1, "config", "train.stepz:x", "1")]),
    (
      [
        "prog",
        "--config_other=1",
        "--config_other",
        "f.py",
        "--configs.x=1",
        "--other.config.x=1",
        "config.x=1",
        "---config=f.py",
        "--verbose",
      ],
      [],
    ),
  ],
)
def test_each_form_splits_into_its_record(argv: list[str], expected: list[ConfigArgument]):
  assert config_arguments(argv, "config") == expected


def test_the_records_keep_their_places_and_flags():
  argv = ["prog", "--sweep=s.py", "--config", "f.py", "--config.model.D=64", "--sweep.seeds=3"]
  assert config_arguments(argv, "config") == [
    ConfigArgument(2, "config", None, "f.py"),
    ConfigArgument(4, "config", "model.D", "64"),
  ]
  assert config_arguments(argv, "sweep") == [
    ConfigArgument(1, "sweep", None, "s.py"),
    ConfigArgument(5, "sweep", "seeds", "3"),
  ]


@pytest.mark.parametrize(
  "arg",
  [
    "--config.train.steps=5",
    "-config.train.steps=5",
    "--noconfig.train.flag",
    "-noconfig.train.flag=false",
    "--config.train.steps",
    "--config.a=b=c",
  ],
)
def test_an_override_reads_back_as_typed(arg: str):
  assert [argument.text for argument in config_arguments(["prog", arg], "config")] == [arg]


def test_renames_work_over_the_records():
  argv = [
    "prog",
    "-config",
    "--config.taper.fast_path=1",
    "-noconfig.taper.fast_path",
    "--config.taper.aux_weight",
    "0.5",
    "--config_other.taper.fast_path=1",
  ]
  with pytest.warns(TaperNormDeprecationWarning):
    arguments = rename_overrides(argv, "config")
  assert argv[1:] == [
    "-config",
    "--config.train.fixed_step=1",
    "-noconfig.train.fixed_step",
    "--config.taper.scale_loss_weight",
    "0.5",
    "--config_other.taper.fast_path=1",
  ]
  assert arguments == [
    ConfigArgument(1, "config", None, "--config.train.fixed_step=1", dashes="-"),
    ConfigArgument(2, "config", "train.fixed_step", "1"),
    ConfigArgument(3, "config", "train.fixed_step", None, negated=True, dashes="-"),
    ConfigArgument(4, "config", "taper.scale_loss_weight", None),
  ]
