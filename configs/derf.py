"""The `derf` variant: every norm Derf, γ·erf(α·h + s) + β, from the start (docs/method.md §14); arguments:
size=1m|3m|9m|30m|1b|cpu, aux=0|1, seed=N."""

from configs import base


def get_config(arg: str | None = None):
  """Config for derf; e.g. --config=configs/derf.py:size=9m,seed=3."""
  return base.get_config("derf", arg)
