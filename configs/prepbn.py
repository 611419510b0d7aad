"""The `prepbn` variant: every norm blended from RMSNorm into RepBN(h) = BN(h) + η·h by PRepBN's λ, which folds at
inference (docs/method.md §15); arguments: size=1m|3m|9m|30m|1b|cpu, aux=0|1, seed=N."""

from configs import base


def get_config(arg: str | None = None):
  """Config for prepbn; e.g. --config=configs/prepbn.py:size=9m,seed=3."""
  return base.get_config("prepbn", arg)
