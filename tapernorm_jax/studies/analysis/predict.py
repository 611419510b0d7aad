"""Predict, then check: before a study's largest size trains, each method's loss there is predicted from its
loss-compute law fitted on the smaller sizes (fits.py), with an interval, and written to
DIR/predictions.json; the report then says whether each measured loss fell inside its interval."""

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tapernorm_jax.storage.run_files import read_json, write_json_atomically
from tapernorm_jax.markdown import markdown_table
from tapernorm_jax.studies.analysis import coverage, fits
from tapernorm_jax.studies.analysis.aggregate import Group, aggregate
from tapernorm_jax.studies.spec import Cell, SweepError
from tapernorm_jax.studies.analysis.run_rows import label, read_runs, size_order, variant_order
from tapernorm_jax.studies.analysis.scaling import MIN_LAW_SIZES as MIN_FITTED, RESAMPLES, training_compute

FILE = "predictions.json"


def split_largest(cells: Sequence[Cell]) -> tuple[list[Cell], list[Cell]]:
  """(the cells of every size but the largest, the largest size's cells); a SweepError where too few sizes remain
  to fit a law."""
  if len(budgets := sorted({c.budget or "the sizes' own steps" for c in cells})) > 1:
    raise SweepError(
      f"--hold_out_largest: the grid has {len(budgets)} token budgets ({', '.join(budgets)}); a "
      "prediction follows one budget's ladder, so sweep one budget at a time"
    )
  sizes = sorted({c.size for c in cells}, key=size_order)
  if len(sizes) < MIN_FITTED + 1:
    raise SweepError(
      f"--hold_out_largest: the grid has {len(sizes)} size(s) ({', '.join(sizes)}); predicting the "
      f"largest needs at least {MIN_FITTED} below it to fit L(C) = E + A·C^(−α); add sizes"
    )
  return [c for c in cells if c.size != sizes[-1]], [c for c in cells if c.size == sizes[-1]]


def predict_once(
  workdir: str, held_out: Sequence[Cell], planned: Mapping[str, float], resamples: int = RESAMPLES
) -> list[str]:
  """Predicts the held-out size (`predict`) unless a prediction was written before; lines saying what holds. A
  size that has started without one gets none: it would not be a prediction."""
  if (earlier := read(workdir)) is not None:
    return [f"keeping the prediction written before {earlier['size']} started ({workdir}/{FILE})"]
  if started := [c.name for c in held_out if os.path.exists(os.path.join(workdir, c.name))]:
    return [f"no prediction: {held_out[0].point} had started before one was written ({', '.join(started)})"]
  return [
    *describe(predict(workdir, held_out, planned, resamples)),
    f"(written to {workdir}/{FILE} before {held_out[0].point} starts)",
  ]


def predict(
  workdir: str, held_out: Sequence[Cell], planned: Mapping[str, float], resamples: int = RESAMPLES
) -> dict[str, Any]:
  """Each held-out method's predicted loss at its size, from the study's complete smaller runs, at the training
  FLOPs `planned` gives each held-out cell by name (`grid.planned_compute`); writes FILE."""
  runs = read_runs(workdir)
  groups = aggregate([r for r in runs if r.size != held_out[0].point])
  compute = training_compute(runs)
  size = held_out[0].point
  rows = []
  for key in sorted({(c.variant, c.aux) for c in held_out}, key=variant_order):
    target = planned[next(c.name for c in held_out if (c.variant, c.aux) == key)]
    mine = sorted(
      (g for g in groups if (g.variant, g.aux) == key and g.n and g.size in compute), key=lambda g: size_order(g.size)
    )
    seeds = sum(1 for c in held_out if (c.variant, c.aux) == key)
    row = {"variant": key[0], "aux": key[1], "fitted_sizes": [g.size for g in mine], "seeds": seeds, "compute": target}
    if len(mine) >= MIN_FITTED:
      law = fits.compute_fit([compute[g.size] for g in mine], [g.losses for g in mine], resamples)
      predicted = law.predict(target, fits.pooled_std([g.losses for g in mine]) / np.sqrt(seeds))
      row.update(predicted=predicted.value, low=predicted.low, high=predicted.high, law=list(law.law))
    rows.append(row)
  measured = (coverage.committed() or {}).get("rates", {}).get("measured mean inside the prediction")
  result = {"size": size, "level": fits.LEVEL, "rows": rows, **({"coverage": measured} if measured else {})}
  write_json_atomically(os.path.join(workdir, FILE), result)
  return result


def describe(result: dict[str, Any]) -> list[str]:
  """One line per method: its prediction, or why there is none."""
  lines = []
  for r in result["rows"]:
    what = (
      f"{r['predicted']:.4f} [{r['low']:.4f}, {r['high']:.4f}]"
      if "predicted" in r
      else f"no prediction: {len(r['fitted_sizes'])} smaller size(s) complete, {MIN_FITTED} needed"
    )
    lines.append(f"predicted at {result['size']}: {label(r['variant'], r['aux'])} {what}")
  return lines


def read(workdir: str) -> dict[str, Any] | None:
  """DIR/predictions.json, or None where the study made none."""
  return read_json(os.path.join(workdir, FILE))


def markdown(result: dict[str, Any], groups: Sequence[Group]) -> str:
  """Each prediction beside the loss measured afterwards, and whether it fell inside the interval."""
  measured = {(g.variant, g.aux): g for g in groups if g.size == result["size"] and g.n}
  body = []
  for r in result["rows"]:
    g = measured.get((r["variant"], r["aux"]))
    guess = f"{r['predicted']:.4f} [{r['low']:.4f}, {r['high']:.4f}]" if "predicted" in r else "—"
    seen = f"{g.mean:.4f} (n = {g.n})" if g else "not yet measured"
    inside = "—" if not (g and "predicted" in r) else ("yes" if r["low"] <= g.mean <= r["high"] else "**no**")
    body.append([label(r["variant"], r["aux"]), ", ".join(r["fitted_sizes"]), guess, seen, inside])
  table = markdown_table(["method", "fitted on", f"predicted [{result['level']:.0%}]", "measured", "inside"], body)
  exact = [
    label(r["variant"], r["aux"]) for r in result["rows"] if "predicted" in r and len(r["fitted_sizes"]) == MIN_FITTED
  ]
  if not exact:
    return table
  return (
    f"{table}\n\nFitted on 3 sizes ({', '.join(exact)}), the 3-parameter law goes through its points "
    "exactly: the interval holds the seeds' noise and the law's bootstrap spread, but nothing measures how far the law "
    "itself is off at the next size (a fourth fitted size would); the simulated coverage assumes the law holds."
  )
