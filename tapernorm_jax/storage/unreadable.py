"""A checkpoint or export that Orbax lists as complete but that cannot be read back: the error, its reason in one
line, and the pages of noise the aborted reads leave behind, dropped. No training code: an export loads with it."""

import logging
import os
import re
import sys
from typing import Any

from tapernorm_jax.errors import UserError

ABORTED_TASK = re.compile(
  r"(Task|Future) exception was never retrieved.*(orbax|tensorstore|ocdbt|zarr)", re.IGNORECASE | re.DOTALL
)  # how asyncio logs a read that a failed restore left behind


class DamagedCheckpointError(UserError, ValueError):
  """A checkpoint (or an export; step None) that Orbax lists as complete but that cannot be read back."""

  def __init__(self, message: str, step: int | None, reason: str):
    super().__init__(message)
    self.step, self.reason = step, reason


def read_error(error: BaseException, step_dir: str) -> str:
  """The innermost cause of a failed restore in one short line (TensorStore's specs and paths left out)."""
  while (inner := error.__cause__ or error.__context__) is not None:
    error = inner
  lines = str(error).strip().splitlines() or [type(error).__name__]
  line = re.sub(r"\s*\[tensorstore_spec.*$", "", lines[0])
  line = re.sub(r" in OCDBT database at local file \"[^\"]*\"|Error opening \"\w+\" driver: ", "", line)
  line = line.replace(step_dir + os.sep, "")
  line = line if line.startswith(type(error).__name__) or ":" in line[:20] else f"{type(error).__name__}: {line}"
  return line if len(line) <= 240 else line[:237] + "..."


def quiet_aborted_reads() -> None:
  """Drops the pages of noise a failed restore leaves behind: TensorStore reads still in flight report "Event loop is
  closed" and Orbax's coroutines their errors through sys.unraisablehook, and asyncio logs its tasks' errors. They
  say nothing the DamagedCheckpointError does not. Idempotent; call it before a restore (the noise can come first)."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_aborted_reads", False):
    return

  def hook(unraisable: Any) -> None:
    closed_loop = isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine of the aborted restore, collected unawaited
    if not (closed_loop or (code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename)):
      previous(unraisable)

  hook.drops_aborted_reads = True
  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(lambda record: not is_aborted_read(record))


def is_aborted_read(record: logging.LogRecord) -> bool:
  """Whether asyncio's record is an unretrieved task of a failed restore: by its message, or by an Orbax or
  TensorStore frame in its exception's traceback (the task's repr does not always name them)."""
  message = record.getMessage()
  if ABORTED_TASK.match(message):
    return True
  if not message.startswith(("Task exception was never retrieved", "Future exception was never retrieved")):
    return False
  error = record.exc_info[1] if record.exc_info else None
  while error is not None:
    tb = error.__traceback__
    while tb is not None:
      if any(f"{os.sep}{name}{os.sep}" in tb.tb_frame.f_code.co_filename for name in ("orbax", "tensorstore")):
        return True
      tb = tb.tb_next
    error = error.__cause__ or error.__context__
  return False
