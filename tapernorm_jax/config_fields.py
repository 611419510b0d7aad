"""Names inside an ml_collections config: every field's dotted path, the nearest to a misspelled one, fields that
share one value through a FieldReference (`data.seq_len` is `model.T`: setting one sets both), and the old names
of renamed fields and values, which still load with a deprecation message."""

import copy
import difflib
from collections.abc import Sequence
from typing import Any

import ml_collections

from tapernorm_jax.errors import deprecated

RENAMED_FIELDS = {
  "taper.fast_path": "train.fixed_step",  # old dotted name → new
  "taper.aux_weight": "taper.scale_loss_weight",
  "fakeln.aux_weight": "fakeln.scale_loss_weight",
  "mesh.peer_timeout_s": "mesh.process_timeout_s",
}
RENAMED_VALUES = {"variant": {"vanilla": "baseline"}}  # field → {old value → new}
# Fields that were bools and now name a choice: the old values (or their spelling on a command line) keep their
# meaning, without a message (every run written before the change carries one).
FORMER_BOOLS = {"model.remat": {True: "full", False: "none"}, "model.scan_layers": {True: "scanned", False: "unrolled"}}


def current_name(dotted: str) -> str:
  """The field `dotted` names today (a renamed one with a deprecation message)."""
  if dotted in RENAMED_FIELDS:
    deprecated(f"config field {dotted!r} is now {RENAMED_FIELDS[dotted]!r}; the old name still works for now")
    return RENAMED_FIELDS[dotted]
  return dotted


def current_value(dotted: str, value: Any) -> Any:
  """`value` as field `dotted` spells it today (a renamed value with a deprecation message; a former bool as the
  choice it meant)."""
  if dotted in FORMER_BOOLS and (isinstance(value, bool) or value in ("True", "False")):
    return FORMER_BOOLS[dotted][value in (True, "True")]
  renamed = RENAMED_VALUES.get(dotted, {})
  if isinstance(value, str) and value in renamed:
    deprecated(f"{dotted}={value!r} is now {dotted}={renamed[value]!r}; the old value still works for now")
    return renamed[value]
  return value


def upgrade(config: dict[str, Any]) -> dict[str, Any]:
  """A config read from disk (a run's config.json) with today's field names and values; the old ones warn."""
  config = copy.deepcopy(config)
  for old, new in RENAMED_FIELDS.items():
    *old_sections, old_leaf = old.split(".")
    node = config
    for name in old_sections:
      node = node.get(name) if isinstance(node, dict) else None
    if isinstance(node, dict) and old_leaf in node:
      value = node.pop(old_leaf)
      *new_sections, new_leaf = current_name(old).split(".")
      target = config
      for name in new_sections:
        target = target.setdefault(name, {})
      target.setdefault(new_leaf, value)
  for dotted in RENAMED_VALUES:
    if "." not in dotted and dotted in config:
      config[dotted] = current_value(dotted, config[dotted])
  for dotted in FORMER_BOOLS:
    section, leaf = dotted.split(".")
    if isinstance(node := config.get(section), dict) and leaf in node:
      node[leaf] = current_value(dotted, node[leaf])
  return config


def field_paths(cfg: ml_collections.ConfigDict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
  """Every leaf field of `cfg` as a path."""
  paths = []
  for name, value in cfg.items():
    nested = isinstance(value, ml_collections.ConfigDict)
    paths += field_paths(value, prefix + (name,)) if nested else [prefix + (name,)]
  return paths


def nearest(cfg: ml_collections.ConfigDict, dotted: str) -> str | None:
  """The existing dotted field name closest to `dotted`, or None when nothing is close."""
  known = [".".join(path) for path in field_paths(cfg)]
  matches = difflib.get_close_matches(dotted, known, n=1, cutoff=0.6)
  if not matches:  # a badly misspelled section: compare the last part within the sections that exist
    *_, last = dotted.rpartition(".")
    by_last = {path.rpartition(".")[2]: path for path in known}
    matches = [by_last[m] for m in difflib.get_close_matches(last, list(by_last), n=1, cutoff=0.75)]
  return matches[0] if matches else None


def problem(cfg: ml_collections.ConfigDict, dotted: str, name: str = "config") -> str | None:
  """Why `dotted` is not a field of `cfg` (e.g. "config.train has no field 'stepz'"), or None when it is one."""
  node: Any = cfg
  parts = dotted.split(".")
  for i, part in enumerate(parts):
    where = ".".join([name, *parts[:i]])
    if not isinstance(node, ml_collections.ConfigDict):
      return f"{where} is a value, not a section"
    if part not in node:
      kind = "field" if i == len(parts) - 1 else "section"
      return f"{where} has no {kind} {part!r}"
    node = node[part]
  return None


def lookup(cfg: ml_collections.ConfigDict, parts: Sequence[str]) -> Any:
  """What the path `parts` (["train", "steps"], or the sections above a field) names in `cfg`."""
  node = cfg
  for part in parts:
    node = node[part]
  return node


def check(cfg: ml_collections.ConfigDict, checks: Sequence[tuple[bool, str, str]]) -> None:
  """Raises ValueError `field=value: problem` for the first (ok, dotted field, problem) that is not ok."""
  for ok, dotted, problem_text in checks:
    if not ok:
      raise ValueError(f"{dotted}={lookup(cfg, dotted.split('.'))!r}: {problem_text}")


def reference(cfg: ml_collections.ConfigDict, dotted: str) -> ml_collections.FieldReference | None:
  """The FieldReference that field `dotted` holds (shared with every field that refers to it), or None."""
  *sections, leaf = dotted.split(".")
  value = dict(lookup(cfg, sections).items(preserve_field_references=True)).get(leaf)
  return value if isinstance(value, ml_collections.FieldReference) else None


def conflicting(cfg: ml_collections.ConfigDict, changes: dict[str, Any]) -> list[list[tuple[str, Any]]]:
  """Groups of changed fields that hold one shared value yet were given different values (the last would win)."""
  groups: dict[int, list[tuple[str, Any]]] = {}
  for dotted, value in changes.items():
    if problem(cfg, dotted) is None and (ref := reference(cfg, dotted)) is not None:
      groups.setdefault(id(ref), []).append((dotted, value))
  return [group for group in groups.values() if len({repr(value) for _, value in group}) > 1]


def _fits(value: Any, default: Any) -> bool:
  """Whether `value` has the type of a field whose default is `default`: an int passes for a float, a list for a
  tuple; any value where the default is None."""
  if default is None:
    return True
  if isinstance(default, bool) or isinstance(value, bool):
    return type(value) is type(default)
  if isinstance(default, float):
    return isinstance(value, (int, float))
  if isinstance(default, (tuple, list)):
    return isinstance(value, (tuple, list))
  return type(value) is type(default)


def check_like(cfg: ml_collections.ConfigDict, reference: ml_collections.ConfigDict) -> None:
  """Raises ValueError for the first field of `cfg` that `reference` lacks (a config file's misspelling, which no
  run would read) or holds as another type (None or a string where a number goes)."""
  for path in field_paths(cfg):
    dotted = ".".join(path)
    if dotted in RENAMED_FIELDS:
      raise ValueError(f"{dotted}: this field is now {RENAMED_FIELDS[dotted]}; set that one")
    if (why := problem(reference, dotted)) is not None:
      *sections, leaf = path  # a misspelling's nearest name within its own section, not one of another section's
      known = lookup(reference, sections) if sections and problem(reference, ".".join(sections)) is None else {}
      near = difflib.get_close_matches(leaf, list(known), n=1)
      raise ValueError(
        f"{dotted}: {why}; no run reads it" + (f"; did you mean {'.'.join((*sections, near[0]))}?" if near else "")
      )
    value, default = lookup(cfg, path), lookup(reference, path)
    if not _fits(value, default):
      raise ValueError(f"{dotted}={value!r}: must be a {type(default).__name__}, as its default {default!r} is")
