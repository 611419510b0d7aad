"""Which products and attention a train step runs (`train.cpu_paths`): forced, or timed here at the run's shape.

`cpu_kernels.training_paths` offers the candidates for the model's target (only the model's own off CPU); with
`train.cpu_paths=auto` each one's train step (the run's batch, TaperNorm's gates mid-taper) is compiled and timed in
alternated rounds on this host (`cpu_kernels.autotune`, cached per host and shape), and the fastest runs; any
candidate's name forces it. A resumed run keeps the paths it started with (`loop.py` passes them), so its float
summation order, and with it bit-exact resume, does not depend on a later timing.
"""

import functools
from typing import TYPE_CHECKING

import jax
import numpy as np

from tapernorm_jax import cpu_kernels
from tapernorm_jax.cpu_kernels import autotune
from tapernorm_jax.model.transformer import Attend, Projection

if TYPE_CHECKING:
  from tapernorm_jax.train.trainer import Trainer

Paths = tuple[Projection, Attend | None]


def choose(trainer: "Trainer", forced: str | None) -> tuple[autotune.Choice, Paths]:
  """The choice for `trainer`'s run and its (projection, attend): `forced` unless auto, else timed (or cached)."""
  candidates = cpu_kernels.training_paths(trainer.model_cfg, trainer.mesh)
  if autotune.requested(forced) != "auto" and autotune.requested(forced) not in cpu_kernels.TRAINING_PATHS:
    raise ValueError(f"train.cpu_paths={forced!r}: choose auto or one of {', '.join(cpu_kernels.TRAINING_PATHS)}")
  cfg, B = trainer.model_cfg, trainer.cfg.train.batch_size
  shape = {"model": repr(cfg), "method": trainer.method.__class__.__name__, "B": B,
           "microbatches": trainer.cfg.train.microbatches, "mesh": dict(trainer.mesh.shape)}
  label = f"{trainer.cfg.get('size', '?')} {trainer.cfg.get('variant', '?')} {B}×{cfg.T}"
  inputs = functools.cache(lambda: timing_inputs(trainer, B))  # made once, and only if something is timed
  builders = {name: (lambda pair=pair: timed_step(trainer, pair, *inputs())) for name, pair in candidates.items()}
  try:
    choice = autotune.choose("train_paths", label, shape, builders, prefer=cpu_kernels.XLA, forced=forced)
  except ValueError as e:
    raise ValueError(f"train.cpu_paths: {e}") from None
  return choice, candidates[choice.name]


def timing_inputs(trainer: "Trainer", B: int) -> tuple[dict, jax.Array]:
  """A fresh state in the middle of the taper (0 < g < 1) and a random B × (T + 1) batch."""
  state = trainer.init_state(0)
  mid = (trainer.phases.taper_start + trainer.phases.taper_end) // 2
  state["step"] = jax.device_put(np.int32(mid), state["step"].sharding)
  batch_BxT1 = np.random.default_rng(0).integers(0, trainer.model_cfg.V, (B, trainer.model_cfg.T + 1), dtype=np.int32)
  return state, jax.device_put(batch_BxT1, trainer.batch_sharding)


def timed_step(trainer: "Trainer", paths: Paths, state: dict, batch_BxT1: jax.Array) -> autotune.Run:
  """One train step (forward, backward, optimiser) on the batch through `paths`, compiled; the state is not
  updated, so every call does the same work."""
  step = jax.jit(lambda s, b: trainer._train_step(s, b, False, paths), in_shardings=(
      trainer.state_shardings, trainer.batch_sharding)).lower(state, batch_BxT1).compile()
  return lambda: jax.block_until_ready(step(state, batch_BxT1))
