"""Command-line flags generated from a settings dataclass, so a benchmark's fields, defaults and help live once."""

import dataclasses
import typing
from typing import Any

from absl import app, flags


def define_flags(cls: type, help_texts: dict[str, str], flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, Any]:
  """One absl flag per field of the dataclass `cls` (bool, int, float, str, or a tuple as a comma list)."""
  hints = typing.get_type_hints(cls)
  holders = {}
  for field in dataclasses.fields(cls):
    kind, default, text = hints[field.name], field.default, help_texts[field.name]
    if typing.get_origin(kind) is tuple:
      holders[field.name] = flags.DEFINE_list(field.name, [str(x) for x in default], text, flag_values=flag_values)
    else:
      define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
                str: flags.DEFINE_string}[kind]
      holders[field.name] = define(field.name, default, text, flag_values=flag_values)
  return holders


def from_flags(cls: type, holders: dict[str, Any]) -> Any:
  """The dataclass `cls` with every field taken from its flag (comma lists converted to typed tuples)."""
  hints = typing.get_type_hints(cls)
  values = {}
  for name, holder in holders.items():
    kind = hints[name]
    if typing.get_origin(kind) is tuple:
      item = typing.get_args(kind)[0]
      values[name] = tuple(item(x) for x in holder.value)
    else:
      values[name] = holder.value
  return cls(**values)


def settings(argv: list[str], cls: type, holders: dict[str, Any]) -> Any:
  """`from_flags` for an entry point's `main(argv)`: positional arguments are a usage error."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  return from_flags(cls, holders)
