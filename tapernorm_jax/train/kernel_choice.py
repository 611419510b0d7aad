"""Which products and attention a train step runs (`train.cpu_paths`): forced, or timed on this host at the run's shape.

`cpu_kernels.training_paths` offers the candidates for the model's target (only the model's own off CPU). Building a
Trainer times nothing: it trains through a forced path, the only candidate, a choice cached on this host for this
shape, or else the model's own (`untimed`). `Trainer.choose_paths` (which the training loop calls once it holds the
run directory) times the candidates' train steps in alternated rounds (`cpu_kernels.autotune`, cached per host and
shape) where `auto` has no cached choice, and the fastest runs. A resumed run keeps the paths it started with
(`loop.py` forces them), so its float summation order, and with it bit-exact resume, does not depend on a later timing.
"""

from collections.abc import Callable
from typing import Any

from tapernorm_jax import cpu_kernels
from tapernorm_jax.cpu_kernels import autotune
from tapernorm_jax.model import ModelConfig
from tapernorm_jax.model.seams import Attend, Projection

Paths = tuple[Projection, Attend | None]
WHAT = "train_paths"  # the autotune cache's name for these choices


def choose(
  model_cfg: ModelConfig,
  mesh: Any,
  forced: str | None,
  shape: dict[str, Any],
  label: str,
  timed_step: Callable[[Paths], autotune.Run] | None,
) -> tuple[autotune.Choice, Paths]:
  """The choice and its (projection, attend) for a train step of `model_cfg` on `mesh` at `shape` (`label` in the
  log): `forced` unless auto, else cached, else timed through `timed_step` (a candidate's compiled step), or with
  `timed_step` None the model's own, untimed. A `forced` name that is no path is a ValueError naming the field."""
  candidates = cpu_kernels.training_paths(model_cfg, mesh)
  if autotune.requested(forced) != "auto" and autotune.requested(forced) not in cpu_kernels.TRAINING_PATHS:
    raise ValueError(f"train.cpu_paths={forced!r}: choose auto or one of {', '.join(cpu_kernels.TRAINING_PATHS)}")
  builders = (
    {name: (lambda pair=pair: timed_step(pair)) for name, pair in candidates.items()}
    if timed_step
    else {name: None for name in candidates}
  )
  try:
    choice = autotune.choose(
      WHAT, label, shape, builders, prefer=cpu_kernels.XLA, forced=forced, measure=timed_step is not None
    )
  except ValueError as e:
    raise ValueError(f"train.cpu_paths: {e}") from None
  return choice, candidates[choice.name]
