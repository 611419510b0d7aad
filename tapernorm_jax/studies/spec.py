"""A study's cells as data: `Cell` (variant, size, aux, seed, overrides, budget, tag), its name and JSON form, and
the `SweepError` a bad sweep raises. Imports nothing of jax: reading a study's files needs only this."""

import dataclasses
from collections.abc import Mapping
from typing import Any, Self

from tapernorm_jax.errors import UserError


class SweepError(UserError, ValueError):
  """A bad sweep file, flag or grid; the message names the field and its value."""


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of the grid: a variant with its aux setting, a size, a seed, the config overrides, a token budget and
  whether the tuned presets apply."""

  variant: str
  size: str
  aux: int
  seed: int
  overrides: tuple[tuple[str, Any], ...] = ()  # (dotted config key, value), sorted by key
  budget: str = ""  # "": the size's own steps; "steps600": 600 steps; "tpp20": 20 training tokens per parameter
  tag: str = ""  # a grid's name for its settings (a tuning study's `lr1e-2`): cells that differ only in overrides
  tuned: bool = True  # False: the variant's defaults, not the tuned presets (train/tuned.py), under the overrides

  @property
  def point(self) -> str:
    """The size and budget as studies group them: `cpu`, or `cpu@tpp20` with a budget."""
    return point(self.size, self.budget)

  @property
  def name(self) -> str:
    """`<variant>-<point>-aux<0|1>-seed<N>[-<tag>]`; without a budget or tag, the name `experiments.tinystories`
    gives its default workdir."""
    return f"{self.variant}-{self.point}-aux{self.aux}-seed{self.seed}" + (f"-{self.tag}" if self.tag else "")

  @property
  def config_arg(self) -> str:
    """The argument after `:` in `--config=configs/<variant>.py:<arg>` (and of `run_config.get_config`). A cell with a
    token budget trains at the defaults (`tuned=0`) too: the tuned presets were chosen at each size's own steps."""
    defaults = self.budget or not self.tuned
    return f"size={self.size},aux={self.aux},seed={self.seed}" + (",tuned=0" if defaults else "")

  def to_json(self) -> dict[str, Any]:
    """A JSON-friendly description (the manifest and cell records hold it)."""
    return {
      "name": self.name,
      "variant": self.variant,
      "size": self.size,
      "aux": self.aux,
      "seed": self.seed,
      "overrides": dict(self.overrides),
      **({"budget": self.budget} if self.budget else {}),
      **({"tag": self.tag} if self.tag else {}),
      **({} if self.tuned else {"tuned": False}),
    }

  @classmethod
  def from_json(cls, entry: Mapping[str, Any]) -> Self:
    """The cell `to_json` described (JSON lists back to tuples)."""
    return cls(
      entry["variant"],
      entry["size"],
      int(entry["aux"]),
      int(entry["seed"]),
      frozen_overrides(entry.get("overrides") or {}),
      entry.get("budget", ""),
      entry.get("tag", ""),
      bool(entry.get("tuned", True)),
    )


def point(size: str, budget: str) -> str:
  """`cpu` without a budget, `cpu@tpp20` with one."""
  return f"{size}@{budget}" if budget else size


def budget_number(budget: str) -> tuple[str, float]:
  """ "steps600" → ("steps", 600.0), "tpp20" → ("tpp", 20.0): a budget label's kind and number."""
  kind = "steps" if budget.startswith("steps") else "tpp"
  return kind, float(budget.removeprefix(kind))


def frozen_overrides(flat: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
  """{"train.steps": 5, "x.y": [1, 2]} → (("train.steps", 5), ("x.y", (1, 2))): hashable, sorted by key."""
  return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in flat.items()))
