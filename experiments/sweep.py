"""Run a scaling study: `python -m experiments.sweep --sweep=configs/sweeps/NAME.py --workdir=DIR`.

Expands the sweep file's grid (variants × sizes × seeds, shared overrides) into cells, each an
ordinary run in DIR/<variant>-<size>-aux<0|1>-seed<N>/. Complete cells are skipped, incomplete ones
resume, a failing cell is recorded in its cell.json and the others go on. `--parallel=N` runs N
cells at once on disjoint device groups; `--launch=print` writes DIR/commands.txt instead, one
command line per pending cell, for a scheduler. Then: `python -m experiments.report --workdir=DIR`.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from tapernorm_jax import cli, files
from tapernorm_jax.studies import commands, grid, manifest, runner

_SWEEP = cli.define_config_file("sweep", None, "Sweep file, e.g. configs/sweeps/cpu_mini.py.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory: one run directory per cell.")
_PARALLEL = flags.DEFINE_integer("parallel", 0, "Cells at once, each on its own share of the devices "
                                 "(0: one per device on accelerators, one at a time on CPU).")
_LAUNCH = flags.DEFINE_enum("launch", "run", ["run", "print"], "run: train the cells here; print: write "
                            "DIR/commands.txt with one command line per pending cell.")
_RETRY = flags.DEFINE_bool("retry_failed", True, "Run failed cells again (False: leave them failed).")
_PYTHON = flags.DEFINE_string("python", sys.executable, "Interpreter named in --launch=print command lines.")
_PROGRESS = flags.DEFINE_float("progress_every", 30.0, "Seconds between progress lines.")
flags.mark_flags_as_required(["sweep", "workdir"])


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  workdir = os.path.abspath(files.local_path(_WORKDIR.value, "--workdir"))  # cells run and are read here: local only
  cells = grid.expand(_SWEEP.value)  # a bad grid raises SweepError: cli.run reports it in one line
  manifest.write_manifest(workdir, _SWEEP.value, cells, source=config_flags.get_config_filename(flags.FLAGS["sweep"]))
  if _LAUNCH.value == "print":
    path, count = commands.write_commands(cells, workdir, _PYTHON.value)
    print(f"{count} of {len(cells)} cells pending; their command lines are in {path}")
    return
  statuses = runner.run(cells, workdir, parallel=_PARALLEL.value, retry_failed=_RETRY.value,
                        progress_every=_PROGRESS.value)
  failed = [name for name, s in statuses.items() if s.state == "failed"]
  print(f"done: {sum(s.state == 'complete' for s in statuses.values())} of {len(cells)} cells complete"
        + (f", {len(failed)} failed (see DIR/<cell>/cell.json and log.txt): {', '.join(failed)}" if failed else "")
        + f". Report: python -m experiments.report --workdir={workdir}")
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
