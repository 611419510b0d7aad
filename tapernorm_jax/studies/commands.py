"""One command line per cell, for a cluster scheduler: the `experiments.tinystories` run that trains (or resumes) it."""

import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from tapernorm_jax.files import write_text_atomically
from tapernorm_jax.studies.grid import Cell
from tapernorm_jax.studies.manifest import cell_status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
COMMANDS = "commands.txt"  # DIR/commands.txt: one command line per pending cell


def format_value(value: Any) -> str:
  """A value as `--config.X.Y=` parses it back."""
  if isinstance(value, (list, tuple)):
    return repr(tuple(value))
  return str(value)


def command_line(cell: Cell, workdir: str, python: str = sys.executable) -> str:
  """One self-contained shell command that trains (or resumes) the cell in `workdir/<cell name>`."""
  args = [python, "-m", "experiments.tinystories", f"--config=configs/{cell.variant}.py:{cell.config_arg}",
          f"--workdir={os.path.join(os.path.abspath(workdir), cell.name)}"]
  args += [f"--config.{key}={format_value(value)}" for key, value in cell.overrides]
  return f"cd {shlex.quote(ROOT)} && " + " ".join(shlex.quote(a) for a in args)


def write_commands(cells: Sequence[Cell], workdir: str, python: str = sys.executable) -> tuple[str, int]:
  """Writes DIR/commands.txt, one line per cell that is not complete; returns (path, number of lines)."""
  pending = [c for c in cells if cell_status(os.path.join(workdir, c.name)).state != "complete"]
  path = os.path.join(workdir, COMMANDS)
  os.makedirs(workdir, exist_ok=True)
  write_text_atomically(path, "".join(command_line(c, workdir, python) + "\n" for c in pending))
  return path, len(pending)
