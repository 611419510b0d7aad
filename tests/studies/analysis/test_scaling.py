"""A study's scaling fits (scaling.py) on runs drawn from known laws, and predict-then-check (predict.py)."""

import dataclasses
import os

import numpy as np
import pytest

from tapernorm_jax.studies import spec
from tapernorm_jax.runtime import costs
from tapernorm_jax.studies.analysis import aggregate, coverage, figures, fits, predict, run_rows, scaling
from tapernorm_jax.studies.launch import grid
from tapernorm_jax.studies.analysis.run_rows import Run
from sweep_helpers import run_cli, tiny_sweep, write_sweep_file

SIZES = {"cpu_xs": (32, 100_000), "cpu": (64, 250_000), "cpu_m": (96, 600_000), "cpu_l": (128, 1_500_000)}
TOKENS = 300 * 16 * 128
LAW = (1.0, 2.0, 0.3)  # the baseline's E, A, α in compute


def compute_of(size: str) -> float:
  """Training FLOPs of a run of `size` (2 layers, T = 128)."""
  D, N = SIZES[size]
  return costs.train_flops_per_token(N, 2, D, 128) * TOKENS


def runs(gap_a: float, gap_b: float, noise: float = 0.0, seeds: int = 3, control: float | None = None) -> list[Run]:
  """Baseline runs on LAW and all_taper (+aux) runs a·(N/N₀)^(−b) above them, each seed's loss × (1 + noise·z); with
  `control`, baseline (+aux) runs that much above the baseline too."""
  rng = np.random.default_rng(0)
  c0, n0 = compute_of("cpu_xs"), SIZES["cpu_xs"][1]
  out = []
  for size, (D, N) in SIZES.items():
    base = LAW[0] + LAW[1] * (compute_of(size) / c0) ** -LAW[2]
    cells = [("baseline", 0, base), ("all_taper", 1, base * (1 + gap_a * (N / n0) ** -gap_b))]
    cells += [("baseline", 1, base * (1 + control))] if control is not None else []
    for variant, aux, loss in cells:
      for seed in range(seeds):
        out.append(
          Run(
            f"{variant}-{size}-aux{aux}-seed{seed}",
            variant,
            aux,
            size,
            seed,
            "complete",
            params=N,
            tokens=TOKENS,
            final_val_loss=float(loss * (1 + noise * rng.standard_normal())),
            config={"model": {"L": 2, "D": D, "T": 128}},
          )
        )
  return out


def test_exact_laws_are_recovered_with_the_closed_form_multiplier():
  study = scaling.study_fits(rs := runs(0.02, 0.4), aggregate.aggregate(rs), resamples=20)
  (method,) = study.methods
  assert (method.vs_baseline.a.value, method.vs_baseline.b.value) == pytest.approx((0.02, 0.4), rel=1e-4)
  assert study.baseline_law.law == pytest.approx(LAW, rel=1e-3)
  c0 = compute_of("cpu_xs")
  for size, m in zip(method.sizes, method.multipliers):  # where the baseline's law reaches the method's loss
    loss = np.mean([r.final_val_loss for r in rs if (r.size, r.variant) == (size, "all_taper")])
    expected = c0 * ((loss - LAW[0]) / LAW[1]) ** (-1 / LAW[2]) / compute_of(size)
    assert m.value == pytest.approx(expected, rel=1e-3) and m.value < 1  # a worse loss: worth less compute
  assert method.vs_control is None and method.control is None  # the study has no matched control
  text = scaling.markdown(study)
  assert "| all_taper (+aux) | baseline | cpu_xs, cpu, cpu_m, cpu_l | +2.00% [" in text
  assert "the gap shrinks with size" in text


def test_noisy_seeds_give_intervals_that_hold_the_truth_and_figures():
  rs = runs(0.03, 0.5, noise=0.002)
  study = scaling.study_fits(rs, aggregate.aggregate(rs), resamples=200)
  fit = study.methods[0].vs_baseline
  assert fit.b.spans(0.5) and fit.a.spans(0.03) and fit.b.low > 0
  assert fit.lack_of_fit() > 0.01  # the law is the truth here
  gap_fig = figures.figure_gap_fits(study)
  assert gap_fig.axes[0].get_xscale() == "log" and gap_fig.axes[0].get_yscale() == "log"  # every gap positive
  compute_fig = figures.figure_compute_fits(study)
  assert len(compute_fig.axes[0].get_lines()) == 4  # the baseline's and the method's: fitted line and points


def test_the_matched_control_is_fitted_too():
  rs = runs(0.02, 0.4, control=0.01)
  study = scaling.study_fits(rs, aggregate.aggregate(rs), resamples=20)
  control, method = study.methods  # the control is fitted against the baseline like any method
  n0 = SIZES["cpu_xs"][1]
  expected = [(1 + 0.02 * (n / n0) ** -0.4) / 1.01 - 1 for _, n in SIZES.values()]
  assert method.control == ("baseline", 1) and method.vs_control.gaps == pytest.approx(expected, rel=1e-9)
  assert control.key == ("baseline", 1) and control.vs_baseline.gaps == pytest.approx([0.01] * 4, rel=1e-9)
  assert "| all_taper (+aux) | baseline (+aux) |" in scaling.gaps_markdown(study)


def test_each_token_budget_is_fitted_along_its_own_ladder():
  at = lambda rs, budget: [
    dataclasses.replace(r, size=spec.point(r.size, budget), cell=f"{r.cell}-{budget}") for r in rs
  ]
  rs = at(runs(0.02, 0.4), "tpp1") + at(runs(0.05, 0.2), "tpp4")
  fitted = scaling.fits_by_budget(rs, aggregate.aggregate(rs), resamples=20)
  assert [study.budget for study in fitted] == ["tpp1", "tpp4"]
  for study, (a, b) in zip(fitted, [(0.02, 0.4), (0.05, 0.2)]):  # each budget's own law, not a blend of both
    (method,) = study.methods
    assert (method.vs_baseline.a.value, method.vs_baseline.b.value) == pytest.approx((a, b), rel=1e-4)
    assert method.sizes == [f"{size}@{study.budget}" for size in SIZES]
  names = figures.make_figures(rs, aggregate.aggregate(rs), studies=fitted)
  assert {"fits_gap_vs_params@tpp1.png", "fits_loss_vs_compute@tpp4.png"} <= set(names)
  assert figures.figure_title("fits_gap_vs_params@tpp4.png").endswith("(token budget tpp4)")
  scaling_fig = names["fig2_val_loss_vs_params.png"]  # a line per method and budget, each size's tick once
  assert len(scaling_fig.axes[0].containers) == 4 and len(scaling_fig.axes[0].get_xticks()) == len(SIZES)
  plain = runs(0.02, 0.4)  # a study without budgets: one fit, named as before
  (only,) = scaling.fits_by_budget(plain, aggregate.aggregate(plain), resamples=20)
  assert only.budget == "" and "fits_gap_vs_params.png" in figures.make_figures(
    plain, aggregate.aggregate(plain), studies=[only]
  )


def test_one_size_has_no_fits():
  rs = [r for r in runs(0.02, 0.4) if r.size == "cpu"]
  assert scaling.study_fits(rs, aggregate.aggregate(rs)) is None


LADDER = {"cpu_xs": 24, "cpu": 32, "cpu_m": 40, "cpu_l": 48}  # widths for a tiny ladder of the four CPU sizes
# The least training after which every run of the ladder learns context (a run at the unigram reference enters no
# fit): 60 steps of 32 × 32 tokens at LR 1e-2 ended 0.6–1.1 nats under the reference (5.07) at widths 24–48 here;
# width 16 stayed within 0.12 of it, and 6 steps (the other study tests' runs) learn nothing.
LADDER_TRAIN = {"steps": 60, "batch_size": 32, "log_every": 20, "diag_every": 60, "eval_batches": 1}


def ladder_sweep(data_dir: str) -> dict:
  """A tiny ladder: the four CPU sizes at widths 24–48, one layer, all_taper (+aux), 2 seeds, trained until each
  learns context."""
  sweep = tiny_sweep(
    data_dir,
    [dict(variants=["all_taper"], sizes=[size], overrides={"model": {"D": width}}) for size, width in LADDER.items()],
  )
  overrides = sweep["overrides"]
  overrides = {
    **overrides,
    "train": {**overrides["train"], **LADDER_TRAIN},
    "checkpoint": {"every": 60},
    "opt": {"lr": 1e-2},
  }
  return {**sweep, "overrides": overrides, "seeds": (0, 1)}


def test_holding_out_needs_three_smaller_sizes(data_dir):
  cells = grid.expand(ladder_sweep(data_dir))
  smaller, largest = predict.split_largest(cells)
  assert {c.size for c in largest} == {"cpu_l"} and len(smaller) == 6
  with pytest.raises(spec.SweepError, match="the grid has 3 size"):
    predict.split_largest([c for c in cells if c.size != "cpu"])


def test_a_prediction_from_an_exact_law_is_the_law():
  compute = np.geomspace(1e10, 1e12, 4)
  law = fits.compute_fit(compute, [[1.0 + 2.0 * (c / 1e10) ** -0.3] * 3 for c in compute], resamples=50)
  assert law.predict(1e13).value == pytest.approx(1.0 + 2.0 * 1000**-0.3, rel=1e-4)
  widened = law.predict(1e13, noise=0.01)
  assert widened.high - widened.low == pytest.approx(2 * 1.645 * 0.01, rel=0.35)  # the noise alone, ± z(0.95)·σ


def test_a_prediction_from_an_exactly_determined_law_says_its_interval_cannot_hold_the_laws_own_error():
  row = lambda sizes: {
    "variant": "all_taper",
    "aux": 1,
    "fitted_sizes": sizes,
    "predicted": 2.0,
    "low": 1.9,
    "high": 2.1,
  }
  three = predict.markdown({"size": "cpu_xl", "level": 0.9, "rows": [row(["cpu_xs", "cpu", "cpu_m"])]}, [])
  four = predict.markdown({"size": "cpu_xl", "level": 0.9, "rows": [row(["cpu_xs", "cpu", "cpu_m", "cpu_l"])]}, [])
  assert "Fitted on 3 sizes (all_taper (+aux)), the 3-parameter law goes through its points exactly" in three
  assert "goes through its points" not in four and four.startswith("| method | fitted on |")


@pytest.mark.slow
def test_predict_then_check_end_to_end(tmp_path, data_dir):
  sweep_file = write_sweep_file(tmp_path / "ladder.py", ladder_sweep(data_dir))
  workdir = tmp_path / "study"
  flags = (f"--sweep={sweep_file}", f"--workdir={workdir}", "--hold_out_largest", "--parallel=4")  # 2 devices a cell
  out = run_cli("experiments.sweep", *flags).stdout
  assert "predicted at cpu_l: all_taper (+aux) " in out
  written = os.path.getmtime(workdir / predict.FILE)
  assert all(
    written < os.path.getmtime(workdir / c.name / "config.json")  # before any run of cpu_l began
    for c in grid.expand(ladder_sweep(data_dir))
    if c.size == "cpu_l"
  )
  prediction = predict.read(str(workdir))
  assert prediction["coverage"] == coverage.committed()["rates"]["measured mean inside the prediction"]
  runs = run_rows.read_runs(str(workdir))
  for row in prediction["rows"]:  # the compute planned from the config is the compute the runs then spent
    ran = [r for r in runs if (r.size, r.variant, r.aux) == ("cpu_l", row["variant"], row["aux"])]
    assert row["compute"] == pytest.approx(scaling.training_compute(ran)["cpu_l"], rel=1e-12)
  again = run_cli("experiments.sweep", *flags).stdout
  assert "keeping the prediction written before cpu_l started" in again
  assert os.path.getmtime(workdir / predict.FILE) == written
  run_cli("experiments.report", f"--workdir={workdir}")
  text = (workdir / "report.md").read_text()
  assert "## Predicted before cpu_l ran" in text  # (no baseline in this grid: no gap fits)
  row = next(line for line in text.splitlines() if line.startswith("| all_taper (+aux) | cpu_xs, cpu, cpu_m |"))
  assert row.endswith(("| yes |", "| **no** |")) and "(n = 2)" in row
