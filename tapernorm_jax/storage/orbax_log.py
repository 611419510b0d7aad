"""Orbax's log records kept off the terminal while a run trains: written to the run's log file instead.

Orbax logs through absl, and a save that fails in its writer threads (a disk filling mid-write) logs four
tracebacks, about 330 lines, before the run's own one-line error. `to_file(path)` sends every record of Orbax's
modules to `path` for as long as it is entered; where `path` cannot be written (the disk that filled), to a file
in the system's temporary directory. No file is created until a record arrives. This module imports nothing of jax.
"""

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator

FORMAT = logging.Formatter("%(levelname).1s%(asctime)s %(threadName)s %(filename)s:%(lineno)d] %(message)s")


class _ToFile(logging.Filter):
  """Drops Orbax's records from the terminal's handlers, appending each to `path` (None: lets them through)."""

  def __init__(self) -> None:
    super().__init__()
    self.path: str | None = None

  def filter(self, record: logging.LogRecord) -> bool:
    if self.path is None or f"{os.sep}orbax{os.sep}" not in record.pathname:
      return True
    text = FORMAT.format(record) + "\n"
    for path in (self.path, os.path.join(tempfile.gettempdir(), f"tapernorm-orbax-{os.getpid()}.log")):
      try:
        with open(path, "a", encoding="utf-8") as f:
          f.write(text)
        break
      except OSError:  # a full disk: the next place, else the record is dropped (the run's error line says enough)
        continue
    return False


_FILTER = _ToFile()


@contextlib.contextmanager
def to_file(path: str) -> Iterator[None]:
  """Within: Orbax's records go to `path`, not the terminal (absl's logger, through which Orbax logs)."""
  logger = logging.getLogger("absl")
  if _FILTER not in logger.filters:
    logger.addFilter(_FILTER)
  previous, _FILTER.path = _FILTER.path, path
  try:
    yield
  finally:
    _FILTER.path = previous
