"""One command line per cell, for a cluster scheduler:
`python -m tapernorm_jax.studies.launch.cell --study=DIR --cell=NAME`, which runs from an installed package in any
directory (the cell itself is read from DIR/sweep.json)."""

import os
import shlex
import sys
from collections.abc import Sequence

from tapernorm_jax.storage.run_files import workdir_path, write_text_atomically
from tapernorm_jax.studies.spec import Cell, SweepError
from tapernorm_jax.studies.manifest import MANIFEST, cell_status, manifest_cells

CELL_MODULE = "tapernorm_jax.studies.launch.cell"  # the runnable module each command line starts
COMMANDS = "commands.txt"  # DIR/commands.txt: one command line per pending cell


def command_line(cell: Cell, workdir: str, python: str = sys.executable) -> str:
  """One self-contained shell command that trains (or resumes) the cell in `workdir/<cell name>`."""
  args = [python, "-m", CELL_MODULE, f"--study={workdir_path(workdir)}", f"--cell={cell.name}"]
  return " ".join(shlex.quote(a) for a in args)


def write_commands(cells: Sequence[Cell], workdir: str, python: str = sys.executable) -> tuple[str, int]:
  """Writes DIR/commands.txt, one line per cell that is not complete; returns (path, number of lines).

  The commands read their cells from DIR/sweep.json, so it must hold them as they are (`manifest.write_manifest`).
  """
  listed = manifest_cells(workdir)
  for cell in cells:
    if listed.get(cell.name) != cell:
      raise SweepError(
        f"{cell.name}: {os.path.join(workdir, MANIFEST)} does not hold this cell as the grid has it; "
        "write the manifest first (manifest.write_manifest), the command lines read their cells from it"
      )
  pending = [c for c in cells if cell_status(os.path.join(workdir, c.name)).state != "complete"]
  path = os.path.join(workdir, COMMANDS)
  workdir_path(workdir).mkdir(parents=True, exist_ok=True)
  write_text_atomically(path, "".join(command_line(c, workdir, python) + "\n" for c in pending))
  return path, len(pending)
