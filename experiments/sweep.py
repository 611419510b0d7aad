"""Run a scaling study: `python -m experiments.sweep --sweep=configs/sweeps/NAME.py --workdir=DIR`.

Expands the sweep file's grid (variants × sizes × seeds, shared overrides) into cells, each an
ordinary run in DIR/<variant>-<size>-aux<0|1>-seed<N>/. Complete cells are skipped, incomplete ones
resume, a failing cell is recorded in its cell.json and the others go on. `--parallel=N` runs N
cells at once on disjoint device groups; `--launch=ray` runs each pending cell as a task on a Ray
cluster (DIR on storage every node mounts); `--launch=print` writes DIR/commands.txt instead, one
command line per pending cell, for a scheduler. `--hold_out_largest` trains every size but the largest,
writes each method's predicted loss there (DIR/predictions.json), then trains it. Then:
`python -m experiments.report --workdir=DIR`.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from tapernorm_jax import cli
from tapernorm_jax.storage import directory_lock, run_files
from tapernorm_jax.studies import manifest, spec
from tapernorm_jax.studies.launch import commands, grid, ray_launch, runner
from tapernorm_jax.studies.analysis import predict

_SWEEP = cli.define_config_file("sweep", None, "Sweep file, e.g. configs/sweeps/cpu_mini.py.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory: one run directory per cell.")
_PARALLEL = flags.DEFINE_integer(
  "parallel",
  0,
  "Cells at once, each on its own share of the devices (0: one per device on accelerators, one at a time on CPU).",
)
_OVERSUBSCRIBE = flags.DEFINE_bool(
  "oversubscribe",
  False,
  "On CPU, let --parallel exceed the devices: cells then share devices and cores, each slower than alone.",
)
_LAUNCH = flags.DEFINE_enum(
  "launch",
  "run",
  ["run", "ray", "print"],
  "run: train the cells here; ray: as tasks on "
  "a Ray cluster (the cluster extra); print: write DIR/commands.txt with one command line "
  "per pending cell.",
)
_RAY_ADDRESS = flags.DEFINE_string(
  "ray_address",
  "",
  "--launch=ray: the cluster ('auto', host:port or ray://host:port);"
  " empty: Ray's own discovery ($RAY_ADDRESS, a cluster started on this machine, "
  "else a new local one).",
)
_CELL_RESOURCES = flags.DEFINE_string(
  "cell_resources",
  "",
  "--launch=ray: what one cell asks for, as JSON, "
  "e.g. '{\"GPU\": 1}'; empty: one GPU, else one TPU host's chips, else one "
  "node's CPUs.",
)
_MAX_RETRIES = flags.DEFINE_integer(
  "max_retries",
  3,
  "--launch=ray: times a cell is retried (from its last checkpoint) after Ray loses its node or worker.",
)
_RETRY = flags.DEFINE_bool("retry_failed", True, "Run failed cells again (False: leave them failed).")
_PYTHON = flags.DEFINE_string("python", sys.executable, "Interpreter named in --launch=print command lines.")
_PROGRESS = flags.DEFINE_float("progress_every", 30.0, "Seconds between progress lines.")
_HOLD_OUT = flags.DEFINE_bool(
  "hold_out_largest",
  False,
  "Train every size but the largest first, predict each "
  "method's loss at the largest from its fitted law (DIR/predictions.json), then train "
  "it; the report checks the predictions.",
)
flags.mark_flags_as_required(["sweep", "workdir"])


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  workdir = str(run_files.workdir_path(_WORKDIR.value))  # a local path or a URL (gs://...)
  if _HOLD_OUT.value and _LAUNCH.value == "print":
    raise spec.SweepError(
      "--hold_out_largest with --launch=print: the prediction is made between running the smaller "
      "sizes and the largest, and printed commands run elsewhere; use --launch=local or "
      "--launch=ray, or drop --hold_out_largest"
    )
  cells = grid.expand(_SWEEP.value)  # a bad grid raises SweepError: cli.run reports it in one line
  with directory_lock.hold(workdir, "--workdir") as removed:  # one driver per study; a killed one's leftovers go
    if removed:
      print(f"removed {len(removed)} temporary files left by writers that are gone", flush=True)
    sweep(cells, workdir)


def sweep(cells: list[spec.Cell], workdir: str) -> None:
  """Runs (or prints the commands of) the study's pending cells; exits 1 when any failed."""
  manifest.write_manifest(workdir, _SWEEP.value, cells, source=config_flags.get_config_filename(flags.FLAGS["sweep"]))
  if _LAUNCH.value == "print":
    path, count = commands.write_commands(cells, workdir, _PYTHON.value)
    print(f"{count} of {len(cells)} cells pending; their command lines are in {path}")
    return
  resources = ray_launch.parse_resources(_CELL_RESOURCES.value) if _LAUNCH.value == "ray" else None
  stages = [cells]
  if _HOLD_OUT.value:
    stages = list(predict.split_largest(cells))  # too few sizes fails here, before anything trains
    if run_files.is_url(workdir):
      raise ValueError(f"--hold_out_largest reads the runs back here: --workdir={workdir} must be a local directory")
  statuses = {}
  for i, stage in enumerate(stages):
    if i:  # the smaller sizes are done: predict the largest before it trains
      planned = {c.name: grid.planned_compute(c) for c in stage}
      print("\n".join(predict.predict_once(workdir, stage, planned)), flush=True)
    statuses.update(run_stage(stage, workdir, resources))
  failed = [name for name, s in statuses.items() if s.state == "failed"]
  print(
    f"done: {sum(s.state == 'complete' for s in statuses.values())} of {len(cells)} cells complete"
    + (f", {len(failed)} failed (see DIR/<cell>/cell.json and log.txt): {', '.join(failed)}" if failed else "")
    + f". Report: python -m experiments.report --workdir={workdir}"
  )
  if failed:
    sys.exit(1)


def run_stage(cells: list[spec.Cell], workdir: str, resources: dict | None) -> dict:
  """Runs `cells` as --launch says (here or on Ray); their statuses by name."""
  if _LAUNCH.value == "ray":
    try:
      return ray_launch.run(
        cells,
        workdir,
        address=_RAY_ADDRESS.value,
        resources=resources,
        max_retries=_MAX_RETRIES.value,
        retry_failed=_RETRY.value,
        progress_every=_PROGRESS.value,
      )
    except KeyboardInterrupt:  # ray_launch said what stopped and how to resume
      sys.exit(130)
  return runner.run(
    cells,
    workdir,
    parallel=_PARALLEL.value,
    oversubscribe=_OVERSUBSCRIBE.value,
    retry_failed=_RETRY.value,
    progress_every=_PROGRESS.value,
  )


if __name__ == "__main__":
  cli.run(main)
