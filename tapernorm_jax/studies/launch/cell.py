"""Train one cell of a study: `python -m tapernorm_jax.studies.launch.cell --study=DIR --cell=NAME`.

The command line `experiments.sweep --launch=print` writes to DIR/commands.txt for each pending cell. It reads the
cell from DIR/sweep.json and trains (or resumes) it in DIR/NAME/ on this host's devices, as the in-process runner
would (its cell.json records the outcome); it needs no checkout and runs in any directory. A cell that fails
reports its error in one line, as `experiments.tinystories` does; the traceback is in DIR/NAME/log.txt.
"""

import os

from tapernorm_jax.runtime import allocator, platforms

allocator.keep_freed_memory()  # before jax is imported (allocator.py says why); cli.run sets it again, harmlessly
platforms.without_absent_tpu()  # before jax is imported (platforms.py says why)

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from tapernorm_jax import cli  # noqa: E402
from tapernorm_jax.storage import run_files  # noqa: E402
from tapernorm_jax.train import processes  # noqa: E402
from tapernorm_jax.studies.launch import grid, runner  # noqa: E402
from tapernorm_jax.studies.manifest import find_cell  # noqa: E402

_STUDY = flags.DEFINE_string("study", None, "Study directory: the sweep's --workdir, which holds sweep.json.")
_CELL = flags.DEFINE_string(
  "cell", None, "The cell to train, <variant>-<size>-aux<0|1>-seed<N>, as sweep.json names it."
)
flags.mark_flags_as_required(["study", "cell"])


def main(argv: list[str]) -> None:
  """Entry point."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Orbax logs every save step at INFO; our own progress goes to the bar
  study = str(run_files.workdir_path(_STUDY.value))  # a local path or a URL (gs://...)
  cell = find_cell(study, _CELL.value)
  processes.initialize(grid.cell_config(cell).mesh)  # with mesh.distributed: one process per host (or per GPU)
  status = runner.run_cell(cell, study, jax.devices(), runner.trainer_run_fn(), reraise=True)
  if jax.process_index() == 0:
    print(f"{cell.name}: {status.state}; run directory: {os.path.join(study, cell.name)}")


if __name__ == "__main__":
  cli.run(main)
