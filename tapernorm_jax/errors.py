"""Errors a user can fix: the entry points (`tapernorm_jax/cli/`) print their message in one line, no traceback.

Each class mixes `UserError` into the built-in class that fits, so `except ValueError` still catches
a damaged checkpoint and `except OSError` an unreachable hub. Old names that still load warn with
`TaperNormDeprecationWarning`.
"""

import warnings


class UserError(Exception):
  """A mistake in the input (a flag, a config field, a file) whose message names it and says what to change."""


class StoppedError(UserError):
  """The run stopped for a cause outside its input (a full disk, storage that kept failing); the message says what
  to free or retry, and that the same command resumes. The entry points exit 1 (the run stopped), not 2."""


class DownloadError(UserError, RuntimeError):
  """A corpus or model could not be downloaded (offline, or the server refused); the message names the manual route."""


class TaperNormDeprecationWarning(FutureWarning):
  """An old name (a config field or value written before a rename) that still works; shown to users by default
  (a FutureWarning), and an error in this project's tests."""


def deprecated(message: str, stacklevel: int = 3) -> None:
  """Warns, once per message and call site, that an old name was used; `message` names the old and the new."""
  warnings.warn(message, TaperNormDeprecationWarning, stacklevel=stacklevel)
