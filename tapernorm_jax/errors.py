"""Errors a user can fix: the entry points (`tapernorm_jax/cli.py`) print their message in one line, no traceback.

Each class mixes `UserError` into the built-in class that fits, so `except ValueError` still catches
a damaged checkpoint and `except OSError` an unreachable hub.
"""


class UserError(Exception):
  """A mistake in the input (a flag, a config field, a file) whose message names it and says what to change."""


class DownloadError(UserError, RuntimeError):
  """A corpus or model could not be downloaded (offline, or the server refused); the message names the manual route."""
