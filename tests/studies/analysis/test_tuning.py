"""Tuning studies: tagged grids, the tune split they score on, and the report that chooses each method's setting."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from configs.sweeps import tuning as tuning_sweep
from tapernorm_jax.studies import manifest, spec
from tapernorm_jax.studies.launch import grid
from tapernorm_jax.studies.analysis import report, tuning
from tapernorm_jax.taper import phases
from tapernorm_jax.train.run_dir import RunDir
from sweep_helpers import run_cli, tiny_sweep, write_sweep_file


def test_the_tuning_sweep_gives_every_method_the_same_nine_settings_on_the_tune_split_and_the_named_extras():
  cells = grid.expand(tuning_sweep.get_config())
  per_method = {}
  for c in cells:
    per_method.setdefault((c.variant, c.aux, c.size), set()).add(c.tag)
    assert dict(c.overrides)["data.tune_frac"] == 0.1 and c.seed == 0
  assert len(per_method) == 8 * 3
  nine = {f"lr{lr:g}_{knob}" for lr in tuning_sweep.LRS for knob in ("gain1", "gain3", "gain10")}
  assert per_method[("baseline", 0, "cpu")] == nine and per_method[("baseline", 1, "cpu_l")] == nine
  for (variant, aux, size), tags in per_method.items():  # the shared nine, and the extras the sweep file names
    method = f"{variant}:aux={aux}" if f"{variant}:aux={aux}" in tuning_sweep.SETTINGS else variant
    shared = {f"lr{lr:g}_{knob}" for lr in tuning_sweep.LRS for knob in tuning_sweep.SETTINGS[method]}
    assert tags == shared | set(tuning_sweep.EXTRA.get(method, {})), (variant, size)
    assert len(tags) == 9 + {"dyt": 3, "derf": 3, "baseline": 0}.get(variant, 2), (variant, size)
  dyt = grid.cell_config(
    next(c for c in cells if c.variant == "dyt" and c.tag == "lr0.01_alpha25x" and c.size == "cpu")
  )
  assert tuple(dyt.model.norm_alpha) == pytest.approx((20.0, 5.0, 5.0)) and dyt.opt.lr == 0.01
  cal = grid.cell_config(next(c for c in cells if c.variant == "all_taper" and c.tag.endswith("cal150")))
  # the calibration step each setting names is the one the trainer uses
  assert phases.calibration_step(cal.taper.gate_warmup_frac, cal.taper.min_calibration_step, 300, 299) == 150


def test_a_grid_tag_names_its_cells_and_a_bad_or_missing_one_is_named():
  base = dict(variants=["baseline"], sizes=["cpu"])
  cells = grid.expand(
    {
      "seeds": [0],
      "grids": [
        dict(base, tag="lr1e-3", overrides={"opt": {"lr": 1e-3}}),
        dict(base, tag="lr1e-2", overrides={"opt": {"lr": 1e-2}}),
      ],
    }
  )
  assert [c.name for c in cells] == ["baseline-cpu-aux0-seed0-lr1e-3", "baseline-cpu-aux0-seed0-lr1e-2"]
  assert spec.Cell.from_json(cells[1].to_json()) == cells[1]  # the manifest keeps the tag
  with pytest.raises(spec.SweepError, match="appears twice with different overrides; give each grid its own tag"):
    grid.expand({"seeds": [0], "grids": [dict(base, overrides={"opt": {"lr": 1e-3}}), base]})
  with pytest.raises(spec.SweepError, match=r"grids\[0\].tag='lr 3': a tag is letters"):
    grid.expand({"seeds": [0], "grids": [dict(base, tag="lr 3")]})


def fabricated_study(workdir: str, trials: dict[str, list]) -> None:
  """A tuning study of `baseline` at `cpu`, tag → per seed a tune loss (None: that seed failed, "flat": at the
  unigram reference), written as the sweep and the loop leave it."""
  cells = [
    spec.Cell("baseline", "cpu", 0, seed, (("data.tune_frac", 0.1), ("opt.lr", float(tag.split("_")[0][2:]))), tag=tag)
    for tag, losses in trials.items()
    for seed in range(len(losses))
  ]
  manifest.write_manifest(workdir, {"name": "t"}, cells)
  for cell in cells:
    run_dir = os.path.join(workdir, cell.name)
    os.makedirs(run_dir)
    loss = trials[cell.tag][cell.seed]
    if loss is None:
      manifest.write_record(run_dir, {**cell.to_json(), "status": "failed", "error": "FloatingPointError: nan"})
      continue
    val = 5.5 if loss == "flat" else loss + 0.5  # the validation split scores otherwise: it must not choose
    RunDir(run_dir).write_results(
      {
        "variant": "baseline",
        "size": "cpu",
        "seed": cell.seed,
        "scale_loss_weight": 0.0,
        "steps": 6,
        "complete": True,
        "final_val_loss": val,
        "unigram_val_loss": 5.52,
        "eval_losses": {"val": val, "tune": 5.5 if loss == "flat" else loss},
      }
    )


def test_the_least_mean_tune_loss_is_chosen_among_settings_whose_every_seed_trained(tmp_path):
  trials = {
    "lr0.001_gain1": [2.0, 2.2],
    "lr0.003_gain1": [1.5, None],  # lowest, but a seed failed
    "lr0.01_gain1": [1.9, "flat"],  # lower than the chosen one, but a seed learned nothing
    "lr0.003_gain3": [2.1, 1.8],
  }
  workdir = str(tmp_path / "study")
  fabricated_study(workdir, trials)
  assert tuning.is_tuning_study(workdir)
  by_tag = {t.tag: t for t in tuning.read_trials(workdir)}
  assert by_tag["lr0.003_gain3"].mean == pytest.approx(np.mean([2.1, 1.8]))
  assert by_tag["lr0.003_gain3"].knob == "gain3" and by_tag["lr0.003_gain3"].lr == 0.003
  assert not by_tag["lr0.003_gain1"].complete and not by_tag["lr0.01_gain1"].complete
  written = report.write_report(workdir)  # a tagged study gets the tuning report
  chosen = json.loads(open(os.path.join(workdir, "tuning.json")).read())["baseline:aux=0"]["cpu"]
  assert chosen["tag"] == "lr0.003_gain3" and chosen["overrides"] == {"data.tune_frac": 0.1, "opt.lr": 0.003}
  assert chosen["tune_loss"] == pytest.approx(1.95)
  text = open(written["report"]).read()
  assert "the last 10% of the training stream" in text  # data.tune_frac, from the manifest
  assert "| gain3 | 0.003 | **1.950** |" in text and "| gain1 | 0.001 | 2.100 |" in text
  assert "| gain1 | 0.003 | failed |" in text and "| gain1 | 0.01 | no context |" in text
  assert (written["runs"], written["complete"], written["no_context"]) == (8, 7, 1)  # the failed seed did not finish
  with Image.open(written["figures"][0]) as png:
    assert png.size[0] > 300 and png.size[1] > 300


def test_a_size_whose_runs_have_not_trained_is_none_yet_and_one_whose_every_run_failed_is_none(tmp_path):
  workdir = str(tmp_path / "study")
  fabricated_study(workdir, {"lr0.001_gain1": [None], "lr0.003_gain1": [None]})  # at cpu every run failed
  cells = [
    spec.Cell("baseline", "cpu", 0, 0, (("data.tune_frac", 0.1), ("opt.lr", lr)), tag=f"lr{lr:g}_gain1")
    for lr in (0.001, 0.003)
  ]
  waiting = [spec.Cell("baseline", "cpu_l", 0, 0, c.overrides, tag=c.tag) for c in cells]  # never started
  manifest.write_manifest(workdir, {"name": "t"}, cells + waiting)
  text = open(report.write_report(workdir)["report"]).read()
  assert "| baseline | cpu | none (no setting trained on every seed) |" in text
  assert "| baseline | cpu_l | none yet (its runs have not trained) |" in text


@pytest.mark.slow  # ~30 s: two cells trained, then reported
def test_a_tuning_study_trains_on_the_held_out_tail_and_scores_there(tmp_path, data_dir):
  grids = [
    dict(variants=["baseline"], sizes=["cpu"], tag=f"lr{lr:g}", overrides={"opt": {"lr": lr}}) for lr in (1e-3, 3e-2)
  ]
  sweep = tiny_sweep(data_dir, grids)
  sweep["overrides"]["data"]["tune_frac"] = 0.2
  workdir = str(tmp_path / "study")
  run_cli(
    "experiments.sweep",
    f"--sweep={write_sweep_file(tmp_path / 'tuning.py', sweep)}",
    f"--workdir={workdir}",
    "--parallel=2",
  )
  run_cli("experiments.report", f"--workdir={workdir}")
  trials = tuning.read_trials(workdir)
  results = {t.tag: manifest.read_results(t.runs[0].path) for t in trials}
  for r in results.values():  # each run scored on the tune split beside the validation split, both recorded
    assert set(r["eval_losses"]) == {"val", "tune"} and r["eval_losses"]["val"] == r["final_val_loss"]
    assert np.isfinite(r["eval_losses"]["tune"]) and r["eval_losses"]["tune"] != r["final_val_loss"]
  # six steps learn no context (both runs sit at the unigram reference), so neither may be chosen, and the report
  # says why rather than choosing the less bad one
  assert all(r.status == "no_context" for t in trials for r in t.runs)
  assert json.loads(open(os.path.join(workdir, "tuning.json")).read()) == {"baseline:aux=0": {"cpu": None}}
  text = open(os.path.join(workdir, "tuning.md")).read()
  assert "| baseline | cpu | none (no setting trained on every seed) |" in text and text.count("| no context |") == 2


def test_a_methods_settings_are_listed_in_the_order_of_their_numbers():
  assert sorted(["gain10", "gain3", "gain1"], key=tuning.knob_order) == ["gain1", "gain3", "gain10"]
  assert sorted(["alpha25x", "alpha1x", "alpha5x"], key=tuning.knob_order) == ["alpha1x", "alpha5x", "alpha25x"]
  assert sorted(["blend36-299", "blend10-150"], key=tuning.knob_order) == ["blend10-150", "blend36-299"]
