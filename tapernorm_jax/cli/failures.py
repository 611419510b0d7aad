"""How an error becomes what a user sees: one line on stderr, `error: <what, the value, what is allowed, the fix>`,
and an exit code; anything else is a bug and keeps its traceback.

    exit 2   a mistake: every flag and config-file mistake `flags.py` finds (an unknown or unparsable flag, a
             missing config file, an unknown config field with the nearest valid name, two flags that set one
             shared value), and an error raised for the input (ValueError from this project's code,
             FileNotFoundError and the other OSErrors about paths, tapernorm_jax.errors.UserError: a damaged
             checkpoint, an unreachable hub, a tokenizer that does not match its cache)
    exit 1   the run stopped: a non-finite loss (FloatingPointError, naming the step and the last checkpoint), the
             device ran out of memory (XLA's RESOURCE_EXHAUSTED), or a cause outside the input (StoppedError: a full
             disk, storage that kept failing)
"""

import os
import sys
import traceback
from typing import NoReturn

from absl import app

from tapernorm_jax.errors import StoppedError, UserError

EXIT_MISTAKE = 2
EXIT_STOPPED = 1
PATH_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError)


def out_of_memory(error: BaseException) -> bool:
  """Whether `error` is XLA running out of device memory."""
  return type(error).__name__ == "JaxRuntimeError" and str(error).startswith("RESOURCE_EXHAUSTED")


def describe(error: BaseException) -> str:
  """The one-line message for a user error."""
  if out_of_memory(error):
    return (
      f"out of device memory ({str(error).splitlines()[0]}); lower train.batch_size or raise "
      "train.microbatches, shorten model.T, or use a smaller model"
    )
  return str(error)


def exit_code(error: BaseException) -> int | None:
  """The exit code for a user error, or None for a bug (which keeps its traceback)."""
  if isinstance(error, (FloatingPointError, StoppedError)) or out_of_memory(error):
    return EXIT_STOPPED
  if isinstance(error, (UserError, app.UsageError, *PATH_ERRORS)):
    return EXIT_MISTAKE
  if isinstance(error, ValueError) and raised_in_project(error):
    return EXIT_MISTAKE
  return None


def project_dirs() -> tuple[str, ...]:
  """Where this project's code lives: the package, and the `configs` and `experiments` packages where imported (a
  checkout, or the user's own copies next to an installed package)."""
  dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
  for name in ("configs", "experiments"):
    dirs += list(getattr(sys.modules.get(name), "__path__", []))
  return tuple(os.path.join(d, "") for d in dirs)


def raised_in_project(error: BaseException) -> bool:
  """Whether `error` was raised by this project's code (its message was written for the user), not a library's."""
  frames = traceback.extract_tb(error.__traceback__)
  return bool(frames) and frames[-1].filename.startswith(project_dirs())


def raised_in(error: BaseException, package: str) -> bool:
  """Whether the innermost frame of `error`'s traceback is in `package`."""
  frames = traceback.extract_tb(error.__traceback__)
  return bool(frames) and f"{os.sep}{package}{os.sep}" in frames[-1].filename


def fail(message: str, code: int = EXIT_MISTAKE) -> NoReturn:
  """Prints `error: message` as one line on stderr and exits with `code`."""
  sys.stdout.flush()
  line = " ".join(part.strip() for part in str(message).strip().splitlines() if part.strip())
  sys.stderr.write(f"error: {line}\n")
  sys.stderr.flush()
  sys.exit(code)
