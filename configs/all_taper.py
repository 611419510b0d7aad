"""The paper's `all_taper` variant (docs/method.md §7); arguments: size=1m|3m|9m|30m|1b|cpu, aux=0|1, seed=N."""

from configs import base


def get_config(arg: str | None = None):
  """Config for all_taper; e.g. --config=configs/all_taper.py:size=9m,aux=0,seed=3."""
  return base.get_config("all_taper", arg)
