"""The grid of a sweep file: variants × sizes × token budgets × seeds with their config overrides, expanded into
cells, each checked before anything runs; a bad name or value is a SweepError naming the field."""

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from tapernorm_jax.runtime import costs
from tapernorm_jax.model import ModelConfig, abstract_variables, param_count
from tapernorm_jax.studies.spec import Cell, SweepError, budget_number, frozen_overrides
from tapernorm_jax.taper import methods
from tapernorm_jax.taper.variants import SIZES, VARIANTS
from tapernorm_jax.train import run_config

SWEEP_FIELDS = ("grids", "name", "overrides", "seeds", "tuned")
GRID_FIELDS = ("variants", "sizes", "budgets", "seeds", "overrides", "tag", "tuned")
TAG = re.compile(r"[A-Za-z0-9_.+-]+")  # a grid's tag: part of its cells' names and directories
BUDGET_KINDS = {"steps": "steps", "tokens_per_param": "tpp"}  # a budget's spelling in the sweep file → in its label


def parse_budget(spec: Any, where: str) -> str:
  """`"steps=600"` → "steps600", `"tokens_per_param=20"` → "tpp20", None or "" → "" (the size's own steps)."""
  if spec in (None, ""):
    return ""
  kind, _, value = spec.partition("=") if isinstance(spec, str) else ("", "", "")
  try:
    number = float(value) if kind == "tokens_per_param" else int(value)
  except ValueError:
    number = 0
  if kind not in BUDGET_KINDS or not number > 0:
    raise SweepError(
      f"{where}={spec!r}: a budget is 'steps=<positive integer>', 'tokens_per_param=<positive "
      "number>' (steps = that × parameters ÷ tokens per step), or None for the size's own steps"
    )
  return f"{BUDGET_KINDS[kind]}{number:g}" if kind == "tokens_per_param" else f"steps{number}"


@functools.lru_cache(maxsize=64)
def model_params(model_cfg: ModelConfig) -> int:
  """Trainable parameters of a model, from shapes alone."""
  return param_count(abstract_variables(model_cfg)["params"])


def cell_config(cell: Cell) -> ml_collections.ConfigDict:
  """The full run config of `cell`: its variant's config with the overrides applied, its budget's steps."""
  cfg = run_config.get_config(cell.variant, cell.config_arg)
  for key, value in cell.overrides:
    set_field(cfg, key, value)
  if cell.budget:
    cfg.train.steps = budget_steps(cell.budget, cfg)
  return cfg


def planned_compute(cell: Cell) -> float:
  """Training FLOPs `cell` will spend (6·N + 12·L·D·T per token × its tokens), from its config alone."""
  cfg = cell_config(cell)
  model_cfg = ModelConfig.from_config(cfg.model)
  tokens = cfg.train.steps * cfg.train.batch_size * model_cfg.T
  return costs.train_flops_per_token(model_params(model_cfg), model_cfg.L, model_cfg.D, model_cfg.T) * tokens


def budget_steps(budget: str, cfg: ml_collections.ConfigDict) -> int:
  """The training steps a budget label gives `cfg`: tokens per parameter × the parameters of its size's baseline
  model ÷ tokens per step (batch size × context)."""
  kind, number = budget_number(budget)
  if kind == "steps":
    return int(number)
  for field, value in (("train.batch_size", cfg.train.batch_size), ("model.T", cfg.model.T)):
    if value <= 0:
      raise SweepError(
        f"overrides.{field}={value}: must be positive (a tokens_per_param budget's steps are its "
        "tokens ÷ (train.batch_size × model.T))"
      )
  internal, final, _ = VARIANTS["baseline"]  # the size's baseline: every variant of a size trains the same steps
  params = model_params(
    dataclasses.replace(ModelConfig.from_config(cfg.model), internal_norm=internal, final_norm=final)
  )
  return max(1, round(number * params / (cfg.train.batch_size * cfg.model.T)))


def parse_variant(spec: Any, where: str) -> tuple[str, int]:
  """`all_taper:aux=1` → ("all_taper", 1); a bare variant takes its default aux setting."""
  if not isinstance(spec, str):
    raise SweepError(f"{where}={spec!r}: a variant is a string like 'all_taper' or 'all_taper:aux=0'")
  variant, _, rest = spec.partition(":")
  if variant not in VARIANTS:
    raise SweepError(f"{where}={spec!r}: unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
  if not rest:
    return variant, int(VARIANTS[variant][2])
  if rest not in ("aux=0", "aux=1"):
    raise SweepError(f"{where}={spec!r}: after ':' write aux=0 or aux=1")
  return variant, int(rest[-1])


def is_mapping(value: Any) -> bool:
  """A dict or a ConfigDict (which is not a collections.abc.Mapping)."""
  return isinstance(value, (Mapping, ml_collections.ConfigDict))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"train": {"steps": 5}} → {"train.steps": 5}."""
  flat: dict[str, Any] = {}
  for key, value in tree.items():
    if is_mapping(value):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def set_field(cfg: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """Sets `cfg.<key>` (dotted) as `--config.<key>=` would; an unknown field or a wrong type is a SweepError."""
  *sections, field = key.split(".")
  node = cfg
  for i, section in enumerate(sections):
    if not isinstance(node, ml_collections.ConfigDict) or section not in node:
      raise SweepError(f"overrides.{key}={value!r}: {'.'.join(sections[: i + 1])} is not a config section")
    node = node[section]
  if not isinstance(node, ml_collections.ConfigDict) or field not in node:
    raise SweepError(f"overrides.{key}={value!r}: no such config field")
  try:
    node[field] = value
  except (TypeError, ValueError) as e:
    raise SweepError(f"overrides.{key}={value!r}: {e}") from None


def _as_list(value: Any, where: str) -> list:
  """A list or tuple field of the sweep file, or a SweepError."""
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
    raise SweepError(f"{where}={value!r}: expected a non-empty list")
  return list(value)


def _check_fields(tree: Any, known: Sequence[str], where: str) -> None:
  """Every key of the sweep file (`where` = "") or of one of its grids is a field it may have."""
  if not is_mapping(tree):
    if not where:
      raise SweepError(f"the sweep file's get_config() returned {type(tree).__name__}, not a ConfigDict or dict")
    raise SweepError(f"{where}={tree!r}: expected a dict with variants, sizes, seeds (optional), overrides")
  for key in tree:
    if key not in known:
      if not where:
        raise SweepError(f"{key}: not a sweep field (the fields are {', '.join(known)})")
      raise SweepError(f"{where}.{key}: not a grid field ({', '.join(known)})")


def _grid_cells(grid: Mapping[str, Any], where: str, sweep: Mapping[str, Any]) -> list[Cell]:
  """The cells of one grid (sizes × variants × seeds), its fields checked; `sweep` gives the shared seeds,
  overrides and `tuned`."""
  _check_fields(grid, GRID_FIELDS, where)
  variants = [
    parse_variant(v, f"{where}.variants[{i}]")
    for i, v in enumerate(_as_list(grid.get("variants"), f"{where}.variants"))
  ]
  sizes = _as_list(grid.get("sizes"), f"{where}.sizes")
  for i, size in enumerate(sizes):
    if size not in SIZES:
      raise SweepError(f"{where}.sizes[{i}]={size!r}: unknown size; known: {', '.join(SIZES)}")
  seeds = _as_list(grid.get("seeds", sweep.get("seeds")), f"{where}.seeds (or the sweep's seeds)")
  for i, seed in enumerate(seeds):
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
      raise SweepError(f"{where}.seeds[{i}]={seed!r}: seeds are non-negative integers")
  budgets = [
    parse_budget(b, f"{where}.budgets[{i}]")
    for i, b in enumerate(_as_list(grid.get("budgets", [None]), f"{where}.budgets"))
  ]
  overrides = frozen_overrides({**flatten(sweep.get("overrides") or {}), **flatten(grid.get("overrides") or {})})
  tag = grid.get("tag", "")
  if not isinstance(tag, str) or (tag and not TAG.fullmatch(tag)):
    raise SweepError(
      f"{where}.tag={tag!r}: a tag is letters, digits and _ . + - (it names the grid's cells and their directories)"
    )
  tuned = grid.get("tuned", sweep.get("tuned", True))
  if not isinstance(tuned, bool):
    raise SweepError(
      f"{where}.tuned={tuned!r}: True (the tuned presets where train/tuned.json has them) or False (the defaults)"
    )
  return [
    Cell(variant, size, aux, seed, overrides, budget, tag, tuned)
    for size in sizes
    for budget in budgets
    for variant, aux in variants
    for seed in seeds
  ]


def _check_overrides(cells: Sequence[Cell]) -> None:
  """Builds one config per distinct (variant, size, aux, overrides): bad overrides fail before anything runs, and so
  does a sweep whose every cell a run would refuse (one that some cells refuse runs: those cells fail, named)."""
  checked: set[tuple] = set()
  refused: list[str] = []
  for cell in cells:
    key = (cell.variant, cell.size, cell.aux, cell.overrides, cell.config_arg)
    if key in checked:
      continue
    checked.add(key)
    for name, value in cell.overrides:
      if "." not in name:
        raise SweepError(f"overrides.{name}={value!r}: set variants, sizes and seeds in the grid, not as overrides")
      if name == "train.steps" and any(c.budget for c in cells):
        raise SweepError(
          f"overrides.train.steps={value!r}: the grid has budgets, which set each cell's steps; "
          "give the steps as a budget ('steps=N') instead"
        )
    cfg = cell_config(cell)
    if int(methods.scale_loss_weight(cfg) > 0) != cell.aux:
      field = next(f"overrides.{n}={v!r}" for n, v in cell.overrides if n.endswith(("scale_loss_weight", "aux_weight")))
      raise SweepError(f"{field} contradicts {cell.variant}:aux={cell.aux}; choose the aux setting in the variant list")
    try:
      run_config.validate(cfg, 1)  # the split of the batch over devices is checked where the cell runs
    except ValueError as e:
      refused.append(f"{e}")
  if refused and len(refused) == len(checked):
    raise SweepError(
      f"every cell would be refused, e.g.: {refused[0]} (fix the sweep's overrides; nothing was started)"
    )


def expand(sweep: Mapping[str, Any]) -> list[Cell]:
  """The cells of a sweep file's config, in grid order; checks every name, value and override first."""
  _check_fields(sweep, SWEEP_FIELDS, "")
  cells: dict[str, Cell] = {}
  for g, grid in enumerate(_as_list(sweep.get("grids"), "grids")):
    for cell in _grid_cells(grid, f"grids[{g}]", sweep):
      if cell.name in cells and cells[cell.name] != cell:
        raise SweepError(
          f"grids[{g}]: cell {cell.name} appears twice with different overrides; give each grid its own tag"
        )
      cells[cell.name] = cell
  _check_overrides(list(cells.values()))
  return list(cells.values())
