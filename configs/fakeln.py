"""The `fakeln` variant: all_taper's norms removed one at a time by FakeLN, each frozen at 1/σ_avg, with its batch
scale loss (docs/method.md §10); arguments: size=1m|3m|9m|30m|1b|cpu, aux=0|1, seed=N."""

from configs import base


def get_config(arg: str | None = None):
  """Config for fakeln; e.g. --config=configs/fakeln.py:size=9m,seed=3."""
  return base.get_config("fakeln", arg)
