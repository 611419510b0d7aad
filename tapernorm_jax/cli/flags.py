"""Flags for the entry points: absl flags from a settings dataclass, and config-file flags (`--config=FILE:args`,
`--config.x.y=`) checked before absl parses them, each mistake reported in one line (the nearest valid name
included). Old names of renamed config fields still work, with a deprecation message.
"""

import dataclasses
import difflib
import glob
import os
import re
import sys
import typing
from typing import Any

import ml_collections
from absl import app, flags
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as config_flag_types  # is_config_flag is not re-exported

from tapernorm_jax import config_fields
from tapernorm_jax.cli.failures import fail, raised_in
from tapernorm_jax.errors import UserError

_VERBOSE = flags.DEFINE_bool("verbose", False, "On a mistake, show the full traceback instead of the one-line message.")
CHECK_ONLY = flags.DEFINE_bool(
  "check_only",
  False,
  "Check the flags and config files (every mistake in one line), "
  "then exit without running: a command to check before handing it to a scheduler.",
)


def check_only() -> bool:
  """--check_only (False before the flags are parsed)."""
  return flags.FLAGS.is_parsed() and CHECK_ONLY.value


def verbose(argv: list[str] | None = None) -> bool:
  """--verbose, also before (or when) the flags could be parsed."""
  if flags.FLAGS.is_parsed():
    return _VERBOSE.value
  return any(arg in ("--verbose", "-verbose", "--verbose=true", "--verbose=True") for arg in argv or sys.argv)


class FlagMistake(UserError, ValueError):
  """A mistake on the command line found before (or after) absl parsed it."""


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every mistake (unknown flag, bad value, config file, config field) in one line."""
  try:
    check_config_arguments(argv)
    rest = flags.FLAGS(argv)
    check_parsed_configs()
  except (flags.Error, FlagMistake, AttributeError, KeyError, OSError) as e:
    from_library = isinstance(e, (flags.Error, FlagMistake)) or raised_in(e, "ml_collections") or raised_in(e, "absl")
    if verbose(argv) or not from_library:  # an AttributeError in a config file's own code is a bug there
      raise
    fail(flag_message(e))
  return rest


def flag_message(error: BaseException) -> str:
  """One line for a parsing error: ours as they are, absl's and ml_collections' without their tracebacks."""
  if isinstance(error, FlagMistake):
    return str(error)
  if isinstance(error, flags.UnrecognizedFlagError):
    hint = difflib.get_close_matches(error.flagname, list(flags.FLAGS), n=1)
    return (
      f"--{error.flagname}: no such flag"
      + (f"; did you mean --{hint[0]}?" if hint else "")
      + " (--helpshort lists them)"
    )
  if isinstance(error, flags.IllegalFlagValueError) and "Error whilst parsing config file" in str(error):
    inner = error
    while inner.__context__ is not None:  # ml_collections re-raises get_config's error with its traceback
      inner = inner.__context__
    return f"{str(error).split(':', 1)[0].removeprefix('flag ')}: {inner}"
  text = str(error.args[0] if isinstance(error, KeyError) and error.args else error)
  if required := re.match(r"flag --(\S+)=None: Flag --\1 must have a value other than None", text):
    return f"--{required[1]} is required: {flags.FLAGS[required[1]].help}"
  return text.removeprefix("flag ").replace("\\n", " ").replace("\n", " ")


def define_config_file(name: str, default: str | None, help_string: str, **kwargs: Any) -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file`, safe to import with a bad override: ml_collections loads the default config
  and applies `--name.x.y=` overrides when the flag is defined (at import, before `run`), so an unknown field raised
  there; it is now left to `parse_flags` to report in one line."""
  try:
    return config_flags.DEFINE_config_file(name, default, help_string, **kwargs)
  except Exception:  # noqa: BLE001 (reported by parse_flags' check_config_arguments)
    return config_flags.DEFINE_config_file(name, default, help_string, sys_argv=sys.argv[:1], **kwargs)


def config_flag_names() -> list[str]:
  """The names of every config flag (`--config`, `--sweep`, ...) defined for this program."""
  return [
    name
    for name in list(flags.FLAGS)
    if config_flag_types.is_config_flag(flags.FLAGS[name]) and name == flags.FLAGS[name].name
  ]


@dataclasses.dataclass(frozen=True)
class ConfigArgument:
  """One argument of a config flag: the config file it names (`field` None) or an override of `field`."""

  index: int  # its place in argv
  name: str  # the config flag: config, sweep, ...
  field: str | None  # the dotted field an override sets (train.steps); None for the config file argument
  value: str | None  # the text after `=`; for the config file argument without one, the next argument (if any)
  negated: bool = False  # the boolean form --noconfig.train.flag
  dashes: str = "--"  # -config works as --config does

  @property
  def text(self) -> str:
    """An override as typed (`--config.train.steps=5`, `--noconfig.train.flag`)."""
    value = "" if self.value is None else f"={self.value}"
    return f"{self.dashes}{'no' if self.negated else ''}{self.name}.{self.field}{value}"


def config_argument(argv: list[str], index: int, name: str) -> ConfigArgument | None:
  """argv[index] split as an argument of config flag `name` (`--name=FILE`, `--name FILE`, `--name.x.y=V`,
  `--noname.x.y`, one dash or two), or None when it is not one (`--name_other=1`, a value, another flag)."""
  arg = argv[index]
  if not arg.startswith("-"):
    return None
  dashes = "--" if arg.startswith("--") else "-"
  head, equals, value = arg[len(dashes) :].partition("=")
  if head == name:
    following = argv[index + 1] if index + 1 < len(argv) else None
    return ConfigArgument(index, name, None, value if equals else following, dashes=dashes)
  for negated in (True, False):
    prefix = f"{'no' if negated else ''}{name}."
    if head.startswith(prefix):
      return ConfigArgument(index, name, head[len(prefix) :], value if equals else None, negated, dashes)
  return None


def config_arguments(argv: list[str], name: str) -> list[ConfigArgument]:
  """Every argument of config flag `name` in argv, in order, split into ConfigArguments."""
  return [argument for index in range(len(argv)) if (argument := config_argument(argv, index, name))]


def check_config_arguments(argv: list[str]) -> None:
  """Before absl parses them: the config file each config flag names exists and loads, and every override
  (`--config.train.steps=...`) names a field it has; FlagMistake names the argument, the problem and the fix."""
  for name in config_flag_names():
    flag = flags.FLAGS[name]
    arguments = rename_overrides(argv, name)
    files = [argument for argument in arguments if argument.field is None]
    overrides = [argument for argument in arguments if argument.field is not None]
    if files:
      config = load_config(flag, name, files[-1].value or "")
    elif overrides:
      config = flag.value
      if not isinstance(config, ml_collections.ConfigDict):
        raise FlagMistake(missing_default(name, flag))
    else:
      continue
    for override in overrides:
      check_override(config, override)


def check_override(config: ml_collections.ConfigDict, override: ConfigArgument) -> None:
  """FlagMistake if `override` names no field of `config`, with the nearest field (or the fields there are)."""
  if problem := config_fields.problem(config, override.field, override.name):
    hint, fields = config_fields.nearest(config, override.field), ", ".join(config.keys())
    fix = f"did you mean --{override.name}.{hint}?" if hint else f"{override.name} has the fields: {fields}"
    raise FlagMistake(f"{override.text}: {problem}; {fix}")


def rename_overrides(argv: list[str], name: str) -> list[ConfigArgument]:
  """Rewrites, in place, overrides of renamed fields (`--config.taper.fast_path=`) to today's names, with a
  deprecation message; returns the arguments of config flag `name`, renamed."""
  arguments = [renamed(argument) for argument in config_arguments(argv, name)]
  for argument in arguments:
    if argument.field is not None:
      argv[argument.index] = argument.text
  # a config file given as the next argument reads that argument as renamed (as absl will)
  return [config_argument(argv, argument.index, name) if argument.field is None else argument for argument in arguments]


def renamed(argument: ConfigArgument) -> ConfigArgument:
  """An override with the old name its field starts with (word characters and dots) changed to today's."""
  if argument.field is None:
    return argument
  old = re.match(r"[\w.]*", argument.field).group()  # `taper.fast_path:x` is still found to be an old name
  return dataclasses.replace(argument, field=config_fields.current_name(old) + argument.field[len(old) :])


def load_config(flag: Any, name: str, value: str) -> ml_collections.ConfigDict:
  """The config `--name=value` loads (`path.py[:arguments]`); FlagMistake if the file is missing or refuses."""
  path = value.split(":", 1)[0]
  if not path:
    raise FlagMistake(f"--{name}=: give a config file, e.g. --{name}={flag.default_as_str.strip(chr(39))}")
  if not os.path.isfile(path):
    near = difflib.get_close_matches(path, glob.glob(os.path.join(os.path.dirname(path) or ".", "*.py")), n=1)
    raise FlagMistake(
      f"--{name}={value}: no such file {path!r} (paths are relative to {os.getcwd()})"
      + (f"; did you mean --{name}={near[0]}{value[len(path) :]}?" if near else "")
    )
  try:
    config = flag.parser.parse(value)
  except (ValueError, TypeError) as e:
    inner = e
    while inner.__context__ is not None:  # ml_collections re-raises get_config's error with its traceback
      inner = inner.__context__
    raise FlagMistake(f"--{name}={value}: {inner}") from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise FlagMistake(f"--{name}={value}: the file's get_config() returned {type(config).__name__}, not a config")
  return config


def missing_default(name: str, flag: Any) -> str:
  """The message for a config flag whose default file could not be loaded (run from another directory)."""
  default = flag.default_as_str.strip("'")
  return (
    f"--{name} was not given and its default {default!r} is not there (paths are relative to {os.getcwd()}); "
    f"run from the repository root or pass --{name}=PATH"
  )


def check_parsed_configs() -> None:
  """After parsing: every config flag holds a config, and no two overrides gave one shared field different values
  (`data.seq_len` is `model.T`: the last would silently win)."""
  for name in config_flag_names():
    flag = flags.FLAGS[name]
    if not isinstance(flag.value, ml_collections.ConfigDict):
      raise FlagMistake(missing_default(name, flag))
    for group in config_fields.conflicting(flag.value, config_flags.get_override_values(flag)):
      given = " and ".join(f"--{name}.{dotted}={value}" for dotted, value in group)
      raise FlagMistake(
        f"{given}: these fields are one shared value (setting one sets the other, and the last "
        "would win); give only one of them"
      )


def define_flags(cls: type, help_texts: dict[str, str], flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, Any]:
  """One absl flag per field of the dataclass `cls` (bool, int, float, str, or a tuple as a comma list)."""
  hints = typing.get_type_hints(cls)
  holders = {}
  for field in dataclasses.fields(cls):
    kind, default, text = hints[field.name], field.default, help_texts[field.name]
    if typing.get_origin(kind) is tuple:
      holders[field.name] = flags.DEFINE_list(field.name, [str(x) for x in default], text, flag_values=flag_values)
    else:
      define = {
        bool: flags.DEFINE_bool,
        int: flags.DEFINE_integer,
        float: flags.DEFINE_float,
        str: flags.DEFINE_string,
      }[kind]
      holders[field.name] = define(field.name, default, text, flag_values=flag_values)
  return holders


def from_flags(cls: type, holders: dict[str, Any]) -> Any:
  """The dataclass `cls` with every field taken from its flag (comma lists converted to typed tuples); a value the
  dataclass refuses (its message starts `field=value:`) is an app.UsageError naming the flag."""
  hints = typing.get_type_hints(cls)
  values = {}
  for name, holder in holders.items():
    kind = hints[name]
    if typing.get_origin(kind) is tuple:
      item = typing.get_args(kind)[0]
      try:
        values[name] = tuple(item(x) for x in holder.value)
      except ValueError:
        raise app.UsageError(
          f"--{name}={','.join(holder.value)}: give a comma-separated list of {item.__name__}s"
        ) from None
    else:
      values[name] = holder.value
  try:
    return cls(**values)
  except ValueError as e:
    raise app.UsageError(f"--{e}" if str(e).split("=", 1)[0] in holders else str(e)) from None


def settings(argv: list[str], cls: type, holders: dict[str, Any]) -> Any:
  """`from_flags` for an entry point's `main(argv)`: positional arguments are a usage error."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}; every setting is a --flag (--helpshort lists them)")
  return from_flags(cls, holders)
