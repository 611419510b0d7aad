"""The `dyt` variant: every norm DyT, γ·tanh(α·h) + β, from the start (docs/method.md §14); arguments:
size=1m|3m|9m|30m|1b|cpu, aux=0|1, seed=N."""

from configs import base


def get_config(arg: str | None = None):
  """Config for dyt; e.g. --config=configs/dyt.py:size=9m,seed=3."""
  return base.get_config("dyt", arg)
