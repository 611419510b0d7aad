"""Sweeps: grid expansion and its errors, device packing, failure isolation, resume, command lines (run from an
installed package in any directory), end to end."""

import hashlib
import json
import os
import shlex
import subprocess
import threading
import time

import jax
import pytest

from configs.sweeps import budgets, cpu_mini, ladder, ladder_checks, methods, table2
from tapernorm_jax.studies import manifest, spec
from tapernorm_jax.studies.launch import commands, grid, runner
from tapernorm_jax.studies.analysis import predict, report, run_rows
from tapernorm_jax.train.run_dir import RunDir
from locations import run_without_checkout
from sweep_helpers import quiet, run_cli, tiny_sweep, write_sweep_file


def test_the_shipped_sweeps_expand_to_their_grids():
  cells = grid.expand(table2.get_config())
  assert len(cells) == 4 * 4 * 6 + 2 * 6  # the paper's 84 runs and the matched control, baseline (+aux), per size
  names = {c.name for c in cells}
  assert {
    "baseline-1m-aux0-seed0",
    "baseline-9m-aux1-seed2",
    "internal_taper-30m-aux1-seed5",
    "all_taper-9m-aux1-seed3",
    "final_taper-30m-aux0-seed0",
    "all_taper-30m-aux0-seed5",
  } <= names
  assert "final_taper-1m-aux0-seed0" not in names
  mini = grid.expand(cpu_mini.get_config())
  assert {(c.variant, c.aux) for c in mini} == {
    ("baseline", 0),
    ("baseline", 1),
    ("internal_taper", 1),
    ("all_taper", 1),
    ("all_taper", 0),
    ("final_taper", 0),
  }
  assert len({c.seed for c in mini}) >= 3 and {c.size for c in mini} == {"cpu"}
  cfg = grid.cell_config(mini[0])
  assert cfg.train.diag_every == dict(mini[0].overrides)["train.diag_every"] and cfg.data.source == "synthetic"
  study = grid.expand(methods.get_config())
  by_variant = {c.variant: grid.cell_config(c) for c in study}
  assert {v: cfg.method for v, cfg in by_variant.items()} == {
    "baseline": "taper",
    "internal_taper": "taper",
    "all_taper": "taper",
    "fakeln": "fakeln",
    "prepbn": "prepbn",
    "dyt": "taper",
    "derf": "taper",
  }
  assert by_variant["prepbn"].model.internal_norm == "repbn" and by_variant["dyt"].model.final_norm == "dyt"
  assert len(study) == 8 * 3 * 3 and {c.aux for c in study if c.variant == "baseline"} == {0, 1}
  assert {c.size for c in study} == {"cpu_xs", "cpu", "cpu_l"}
  steps = grid.expand(ladder.get_config())
  assert len(steps) == 4 * 5 * 3 and len(predict.split_largest(steps)[1]) == 4 * 3  # cpu_xl held out
  for tpp in ("5", "20"):  # one budget a study, so the largest size can be held out and predicted
    by_budget = grid.expand(budgets.get_config(tpp))
    assert len(by_budget) == 4 * 4 * 3 and {c.point for c in by_budget} >= {f"cpu_xs@tpp{tpp}", f"cpu_xl@tpp{tpp}"}
    held_out = predict.split_largest(by_budget)[1]
    assert len(held_out) == 4 * 3 and {c.size for c in held_out} == {"cpu_xl"}
  gained = grid.expand(budgets.get_config("20,gain=3"))  # the 20-token study at the tuned gain: each cell gets it
  assert {grid.cell_config(c).model.norm_gain_init for c in gained} == {3.0} and len(gained) == 4 * 4 * 3
  assert {grid.cell_config(c).model.norm_gain_init for c in by_budget} == {1.0}
  with pytest.raises(ValueError, match=r"budgets.py:20,gian=3: give N or N,gain=G"):
    budgets.get_config("20,gian=3")
  checks = grid.expand(ladder_checks.get_config())  # each size's baseline with all_taper's final c as its final γ0
  assert len(checks) == 3 * 3 and {c.variant for c in checks} == {"baseline"}
  final_gains = {(c.size, grid.cell_config(c).model.final_norm_gain_init) for c in checks}
  assert final_gains == set(ladder_checks.FINAL_C.items())


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(grids=[dict(variants=["all_tapr"], sizes=["cpu"])]), "grids[0].variants[0]='all_tapr': unknown variant"),
    (dict(grids=[dict(variants=["all_taper:aux=2"], sizes=["cpu"])]), "grids[0].variants[0]='all_taper:aux=2'"),
    (dict(grids=[dict(variants=["baseline"], sizes=["2m"])]), "grids[0].sizes[0]='2m': unknown size"),
    (dict(grids=[dict(variants=["baseline"], sizes=["cpu"], seeds=[-1])]), "grids[0].seeds[0]=-1"),
    (dict(grids=[dict(variants=["baseline"], sizes=["cpu"], sizes2=1)]), "grids[0].sizes2: not a grid field"),
    (dict(overrides={"train": {"stepz": 5}}), "overrides.train.stepz=5: no such config field"),
    (dict(overrides={"trian": {"steps": 5}}), "overrides.trian.steps=5: trian is not a config section"),
    (dict(overrides={"train": {"steps": "many"}}), "overrides.train.steps='many'"),
    (dict(grid=[]), "grid: not a sweep field"),
    (dict(overrides={"seed": 3}), "overrides.seed=3: set variants, sizes and seeds in the grid"),
    (
      dict(overrides={"taper": {"scale_loss_weight": 0.5}}),
      "overrides.taper.scale_loss_weight=0.5 contradicts baseline:aux=0",
    ),
    (
      dict(grids=[dict(variants=["baseline"], sizes=["cpu"], budgets=["tokens=5"])]),
      "grids[0].budgets[0]='tokens=5': a budget is 'steps=<positive integer>', 'tokens_per_param=<positive number>'",
    ),
    (dict(grids=[dict(variants=["baseline"], sizes=["cpu"], budgets=["steps=0"])]), "grids[0].budgets[0]='steps=0'"),
    (
      dict(
        grids=[dict(variants=["baseline"], sizes=["cpu"], budgets=["steps=600"])], overrides={"train": {"steps": 5}}
      ),
      "overrides.train.steps=5: the grid has budgets, which set each cell's steps",
    ),
  ],
)
def test_bad_sweeps_name_the_field_and_value(change, message):
  bad = {"seeds": (0,), "grids": [dict(variants=["baseline"], sizes=["cpu"])], **change}
  with pytest.raises(spec.SweepError) as e:
    grid.expand(bad)
  assert message in str(e.value)


def test_token_budgets_are_part_of_each_cell_and_order_after_their_size():
  sweep = {
    "seeds": (0,),
    "grids": [
      dict(variants=["baseline"], sizes=["cpu_xs", "cpu"], budgets=[None, "steps=600", "tokens_per_param=2.5"])
    ],
  }
  cells = grid.expand(sweep)
  assert [c.name for c in cells[:3]] == [
    "baseline-cpu_xs-aux0-seed0",
    "baseline-cpu_xs@steps600-aux0-seed0",
    "baseline-cpu_xs@tpp2.5-aux0-seed0",
  ]
  assert [grid.cell_config(c).train.steps for c in cells[:2]] == [300, 600]
  tapered = grid.expand({**sweep, "grids": [{**sweep["grids"][0], "variants": ["all_taper:aux=1"]}]})
  steps = lambda group: [grid.cell_config(c).train.steps for c in group]
  assert steps(tapered) == steps(cells)  # matched budgets
  assert all(spec.Cell.from_json(c.to_json()) == c for c in cells)  # the manifest keeps the budget
  labels = ["cpu@tpp20", "cpu_xs", "cpu@steps600", "cpu", "cpu@tpp2.5", "cpu_xs@tpp1"]
  assert sorted(labels, key=run_rows.size_order) == [
    "cpu_xs",
    "cpu_xs@tpp1",
    "cpu",
    "cpu@steps600",
    "cpu@tpp2.5",
    "cpu@tpp20",
  ]
  with pytest.raises(spec.SweepError, match="the grid has 3 token budgets"):  # each budget is its own ladder
    predict.split_largest(
      grid.expand({**sweep, "grids": [{**sweep["grids"][0], "sizes": ["cpu_xs", "cpu", "cpu_m", "cpu_l"]}]})
    )


def test_a_budget_sweep_trains_each_budget_and_reports_it(tmp_path, data_dir):
  overrides = tiny_sweep(data_dir, [])["overrides"]
  train = {k: v for k, v in overrides["train"].items() if k != "steps"}  # the budgets set the steps
  sweep = {
    **tiny_sweep(data_dir, [dict(variants=["baseline"], sizes=["cpu"], budgets=["steps=3", "tokens_per_param=0.02"])]),
    "overrides": {**overrides, "train": train},
  }
  workdir = str(tmp_path / "study")
  run_cli(
    "experiments.sweep",
    f"--sweep={write_sweep_file(tmp_path / 'budgets.py', sweep)}",
    f"--workdir={workdir}",
    "--parallel=2",
  )
  rows = {r.size: r for r in run_rows.read_runs(workdir)}
  assert set(rows) == {"cpu@steps3", "cpu@tpp0.02"} and all(r.status in run_rows.FINISHED for r in rows.values())
  tpp = rows["cpu@tpp0.02"]  # its steps from the parameters the trained model reports, by the rule's closed form
  assert rows["cpu@steps3"].steps == 3 and tpp.steps == round(0.02 * tpp.params / (train["batch_size"] * 32))
  assert tpp.tokens == tpp.steps * train["batch_size"] * 32
  report.write_report(workdir)
  with open(os.path.join(workdir, "report.md")) as f:
    text = f.read()
  assert "| cpu@steps3 |" in text and "| cpu@tpp0.02 |" in text


def test_device_groups_pack_cells_onto_devices():
  devices = jax.devices()
  assert len(devices) == 8
  assert runner.device_groups(devices, 0) == [devices]  # CPU default: one cell at a time, all devices
  assert runner.device_groups(devices, 8) == [[d] for d in devices]
  assert runner.device_groups(devices, 3) == [devices[0:2], devices[2:4], devices[4:6]]
  assert runner.device_groups(devices[:1], 2, oversubscribe=True) == [devices[:1], devices[:1]]  # sharing, asked for
  with pytest.raises(spec.SweepError) as e:
    runner.device_groups(devices[:2], 3)  # not asked for: named, with what it costs and the fix
  assert str(e.value).startswith("--parallel=3: this host has 2 CPU device(s), so cells would share them") and (
    "use --parallel=2 or less, or add --oversubscribe" in str(e.value)
  )
  with pytest.raises(spec.SweepError, match="--parallel=-1"):
    runner.device_groups(devices, -1)


def fake_results(run_dir: str) -> dict:
  """What loop.run writes for a complete run (enough for cell_status)."""
  results = {"variant": "x", "size": "cpu", "seed": 0, "steps": 6, "complete": True, "final_val_loss": 1.0}
  with open(os.path.join(run_dir, "results.json"), "w") as f:
    json.dump(results, f)
  return results


def test_cell_status_reads_known_results_schemas_only(tmp_path):
  fake_results(str(tmp_path))
  assert manifest.cell_status(str(tmp_path)).state == "complete"  # no schema field: schema 0
  for schema, state in ((1, "complete"), (99, "failed")):
    results = {**json.loads((tmp_path / "results.json").read_text()), "schema": schema}
    (tmp_path / "results.json").write_text(json.dumps(results))
    status = manifest.cell_status(str(tmp_path))
    assert status.state == state
  assert "schema=99" in status.error
  assert manifest.cell_status(str(tmp_path / "nothing")).state == "pending"


def test_a_results_file_changed_after_it_was_written_is_named_and_its_cell_runs_again(tmp_path):
  results = {"variant": "x", "size": "cpu", "seed": 0, "steps": 6, "complete": True, "final_val_loss": 1.25}
  RunDir(tmp_path).write_results(results)
  saved = json.loads((tmp_path / "results.json").read_text())
  content = json.dumps(results, sort_keys=True, separators=(",", ":")).encode()
  assert saved == {**results, "sha256": hashlib.sha256(content).hexdigest()}  # the hash of what it says
  assert manifest.cell_status(str(tmp_path)) == manifest.CellStatus("complete", step=6, results=results)
  (tmp_path / "results.json").write_text((tmp_path / "results.json").read_text().replace("1.25", "1.24"))
  status = manifest.cell_status(str(tmp_path))
  assert status.state == "failed" and status.error.startswith(
    f"unreadable results: {tmp_path}/results.json is damaged: its content does not match the SHA-256"
  )
  assert "run the cell again" in status.error


def test_parallel_runner_isolates_failures_and_skips_complete_cells(tmp_path):
  cells = grid.expand({"seeds": (0, 1, 2), "grids": [dict(variants=["baseline", "all_taper"], sizes=["cpu"])]})
  lock, running, seen = threading.Lock(), set(), []

  def run_fn(cfg, run_dir, *, devices):
    with lock:
      assert not running & set(devices), "two cells on one device"
      running.update(devices)
      seen.append(os.path.basename(run_dir))
    time.sleep(0.05)
    print("a line from the cell")
    with lock:
      running.difference_update(devices)
    if cfg.variant == "all_taper" and cfg.seed == 1:
      raise FloatingPointError("loss is nan at step 3")
    return fake_results(run_dir)

  lines = []
  statuses = runner.run(cells, str(tmp_path), parallel=4, devices=jax.devices()[:4], run_fn=run_fn, echo=lines.append)
  assert sorted(seen) == sorted(c.name for c in cells)
  assert statuses["all_taper-cpu-aux1-seed1"].state == "failed"
  assert "FloatingPointError: loss is nan at step 3" in statuses["all_taper-cpu-aux1-seed1"].error
  assert sum(s.state == "complete" for s in statuses.values()) == 5
  record = manifest.read_record(str(tmp_path / "baseline-cpu-aux0-seed0"))
  assert record["status"] == "complete" and len(record["devices"]) == 1
  assert "a line from the cell" in (tmp_path / "baseline-cpu-aux0-seed0" / runner.CELL_LOG).read_text()
  assert "5/6 complete, 0 running, 1 failed" in lines[-1]
  seen.clear()
  runner.run(cells, str(tmp_path), parallel=2, devices=jax.devices()[:2], run_fn=run_fn, echo=quiet)
  assert seen == ["all_taper-cpu-aux1-seed1"]  # complete cells are skipped, the failed one retried
  seen.clear()
  runner.run(cells, str(tmp_path), devices=jax.devices()[:2], run_fn=run_fn, retry_failed=False, echo=quiet)
  assert seen == []


def test_progress_line_counts_and_estimates(tmp_path):
  cells = grid.expand({"seeds": (0, 1), "grids": [dict(variants=["baseline"], sizes=["cpu"])]})
  progress = runner.Progress(cells, str(tmp_path))
  assert progress.line().startswith("sweep: 0/2 complete, 0 running, 0 failed, 2 to run")
  assert "ETA —" in progress.line()
  assert runner.duration(3725) == "1h02m" and runner.duration(65) == "1m05s" and runner.duration(4) == "4s"


@pytest.mark.slow
def test_tiny_sweep_end_to_end_resume_skip_a_failing_cell_and_the_report(tmp_path, data_dir):
  grids = [
    dict(variants=["baseline", "all_taper:aux=0"], sizes=["cpu"]),
    dict(variants=["internal_taper"], sizes=["cpu"], overrides={"taper": {"taper_end": 99}}),
  ]  # > steps
  sweep_file = write_sweep_file(tmp_path / "tiny.py", tiny_sweep(data_dir, grids))
  workdir = str(tmp_path / "study")
  first = run_cli("experiments.sweep", f"--sweep={sweep_file}", f"--workdir={workdir}", "--parallel=2", check=False)
  assert first.returncode == 1 and "2 of 3 cells complete, 1 failed" in first.stdout
  statuses = {
    c.name: manifest.cell_status(os.path.join(workdir, c.name)) for c in grid.expand(tiny_sweep(data_dir, grids))
  }
  assert {n: s.state for n, s in statuses.items()} == {
    "baseline-cpu-aux0-seed0": "complete",
    "all_taper-cpu-aux0-seed0": "complete",
    "internal_taper-cpu-aux1-seed0": "failed",
  }
  assert "taper.taper_end=99" in statuses["internal_taper-cpu-aux1-seed0"].error
  results = statuses["all_taper-cpu-aux0-seed0"].results
  assert results["steps"] == 6 and results["devices"] == 4  # 8 devices, 2 cells at a time
  mtime = os.path.getmtime(os.path.join(workdir, "baseline-cpu-aux0-seed0", "results.json"))
  again = run_cli("experiments.sweep", f"--sweep={sweep_file}", f"--workdir={workdir}", "--parallel=2", check=False)
  assert "2 already done or skipped, 1 to run" in again.stdout
  assert os.path.getmtime(os.path.join(workdir, "baseline-cpu-aux0-seed0", "results.json")) == mtime
  run_cli("experiments.report", f"--workdir={workdir}")
  with open(os.path.join(workdir, "report.md")) as f:
    text = f.read()
  assert "`internal_taper-cpu-aux1-seed0` (ValueError: taper.taper_end=99" in text
  # six steps teach a model no context: both runs are named, their losses in no mean
  assert "2 of 3 runs complete, 2 of them learned no context." in text
  assert "`baseline-cpu-aux0-seed0` (validation loss" in text and "n = 0 of 1 (**1 learned no context**)" in text
  assert sorted(os.listdir(os.path.join(workdir, "figures"))) == [
    "fig2_val_loss_vs_params.png",
    "fig3_logit_norm.png",
    "fig4_grad_norm.png",
  ]  # no internal_taper: no loss plot


@pytest.mark.slow
def test_printed_commands_run_as_written(tmp_path, data_dir):
  cells = grid.expand(tiny_sweep(data_dir, [dict(variants=["all_taper:aux=0", "baseline"], sizes=["cpu"])]))
  workdir = str(tmp_path / "study")
  manifest.write_manifest(workdir, {"name": "tiny"}, cells)  # the command lines read their cells from it
  os.makedirs(os.path.join(workdir, cells[1].name))
  fake_results(os.path.join(workdir, cells[1].name))  # complete: no command for it
  path, count = commands.write_commands(cells, workdir)
  with open(path) as f:
    lines = f.read().splitlines()
  assert count == 1 and len(lines) == 1
  assert lines[0].endswith(f" -m tapernorm_jax.studies.launch.cell --study={workdir} --cell=all_taper-cpu-aux0-seed0")
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  subprocess.run(["bash", "-c", lines[0]], cwd="/", env=env, check=True, capture_output=True, timeout=600)
  assert manifest.cell_status(os.path.join(workdir, cells[0].name)).state == "complete"
  assert commands.write_commands(cells, workdir)[1] == 0


@pytest.mark.slow
def test_a_printed_command_runs_from_the_package_alone_in_an_empty_directory(tmp_path, data_dir):
  cells = grid.expand(tiny_sweep(data_dir, [dict(variants=["all_taper"], sizes=["cpu"])]))
  workdir = str(tmp_path / "study")
  manifest.write_manifest(workdir, {"name": "tiny"}, cells)
  path, _ = commands.write_commands(cells, workdir)
  with open(path) as f:
    python, flag, module, *args = shlex.split(f.read().splitlines()[0])
  assert (flag, module) == ("-m", "tapernorm_jax.studies.launch.cell")
  script = (
    f"import runpy; sys.argv = {[module, *args]!r}\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
  )
  elsewhere = tmp_path / "elsewhere"  # an empty directory: no configs/ or experiments/ beside it either
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  proc = run_without_checkout(script, elsewhere, python=python, timeout=600, env=env)
  assert "all_taper-cpu-aux1-seed0: complete" in proc.stdout and not os.listdir(elsewhere)
  run_dir = os.path.join(workdir, cells[0].name)
  assert os.path.exists(os.path.join(run_dir, "results.json"))
  assert manifest.read_record(run_dir)["status"] == "complete"
  written = report.write_report(workdir)
  assert (written["runs"], written["complete"]) == (1, 1)


def test_printed_commands_name_the_study_and_the_cell(tmp_path):
  cells = grid.expand(
    {
      "seeds": (3,),
      "grids": [dict(variants=["final_taper"], sizes=["30m"])],
      "overrides": {"data": {"manual_dir": "/data/tiny stories"}, "train": {"steps": 100}},
    }
  )
  line = commands.command_line(cells[0], str(tmp_path / "my study"), python="python3")
  assert line == (
    f"python3 -m tapernorm_jax.studies.launch.cell '--study={tmp_path}/my study' --cell=final_taper-30m-aux0-seed3"
  )
  with pytest.raises(spec.SweepError, match="write the manifest first"):  # the command would find no cell to run
    commands.write_commands(cells, str(tmp_path))
  manifest.write_manifest(str(tmp_path), {}, cells)
  assert manifest.manifest_cells(str(tmp_path)) == {cells[0].name: cells[0]}  # the overrides travel in sweep.json
  assert commands.write_commands(cells, str(tmp_path))[1] == 1


def test_cell_command_mistakes_are_one_line(tmp_path):
  cells = grid.expand({"seeds": (0,), "grids": [dict(variants=["all_taper"], sizes=["cpu"])]})
  study = str(tmp_path / "study")
  manifest.write_manifest(study, {}, cells)
  for flags, message in (
    ([f"--study={tmp_path}", "--cell=all_taper-cpu-aux1-seed0"], f"error: --study={tmp_path}: no sweep.json in it"),
    (
      [f"--study={study}", "--cell=all_tapr-cpu-aux1-seed0"],
      f"error: --cell=all_tapr-cpu-aux1-seed0: {study}/sweep.json has no such cell; did you mean "
      "--cell=all_taper-cpu-aux1-seed0?",
    ),
  ):
    proc = run_cli("tapernorm_jax.studies.launch.cell", *flags, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(message)


def test_cli_bad_sweep_is_one_short_error(tmp_path):
  bad = write_sweep_file(tmp_path / "bad.py", {"seeds": (0,), "grids": [dict(variants=["basline"], sizes=["cpu"])]})
  proc = run_cli("experiments.sweep", f"--sweep={bad}", f"--workdir={tmp_path / 'w'}", check=False)
  assert proc.returncode == 2  # a user error (cli.run); 1 is a sweep with failed cells
  assert proc.stderr.strip().splitlines()[-1].startswith("error: grids[0].variants[0]='basline': unknown variant")
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
  "overrides, budgets, expected",
  [
    ({"taper": {"mu": 5.0}}, None, "error: every cell would be refused, e.g.: taper.mu=5.0: the EMA weight μ must lie"),
    (
      {"train": {"batch_size": 0}},
      ["tokens_per_param=2"],
      "error: overrides.train.batch_size=0: must be positive (a tokens_per_param budget's steps are its tokens ÷",
    ),
  ],
)
def test_a_sweep_every_cell_of_which_would_be_refused_is_one_line_and_starts_nothing(
  tmp_path, overrides, budgets, expected
):
  grid_of = dict(variants=["baseline", "all_taper"], sizes=["cpu"], **({"budgets": budgets} if budgets else {}))
  sweep = {"name": "bad", "seeds": (0,), "grids": [grid_of], "overrides": overrides}
  workdir = tmp_path / "study"
  done = run_cli(
    "experiments.sweep", f"--sweep={write_sweep_file(tmp_path / 'bad.py', sweep)}", f"--workdir={workdir}", check=False
  )
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith(expected) and not workdir.exists()


def test_holding_out_with_printed_commands_is_refused_in_one_line(tmp_path):
  done = run_cli(
    "experiments.sweep",
    "--sweep=configs/sweeps/ladder.py",
    f"--workdir={tmp_path / 'study'}",
    "--launch=print",
    "--hold_out_largest",
    check=False,
  )
  assert done.returncode == 2 and not (tmp_path / "study").exists()
  assert (
    done.stderr.strip()
    .splitlines()[-1]
    .startswith("error: --hold_out_largest with --launch=print: the prediction is made between")
  )
