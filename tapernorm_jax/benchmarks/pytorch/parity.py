"""The peer train benchmark's parity checks: before anything is timed, the peer must compute what this project computes
(the same first loss, the same parameters after one step, the same dtypes, the same malloc setting in every worker of
a row); each check returns what it compared, or raises an error that names the difference."""

from typing import Any

import numpy as np

from tapernorm_jax.errors import UserError

# Measured on this project's 2-core CPU (docs/benchmarks.md), the tolerances with room above them. First loss, relative
# difference: float32 0 to 6e-8, bf16 (autocast on CPU) 1e-5.
LOSS_TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}
# After one step, the worst tensor's max |difference| ÷ its max |parameter|: float32 2e-6 (cpu), 8e-6 (1m), 5e-4
# (9m, 30m), bf16 1e-2. Adam's first update is lr·g/(|g| + eps), so where |g| is near eps float32's rounding moves
# it by up to ~0.1·lr, and bf16's can flip its sign (2·lr): the bound is lr-sized, not a relative precision.
PARAM_TOLERANCE = {"float32": 2e-3, "bfloat16": 5e-2, "float16": 5e-2}
# The update itself, ‖Δours − Δpeer‖ ÷ ‖Δours‖ per tensor: float32 ≤ 5e-4 up to 30m, so a 10% error in the learning
# rate or weight decay (or decay on a gain) fails it; bf16 0.3 (sign flips), not checked.
UPDATE_TOLERANCE = {"float32": 1e-2, "bfloat16": None, "float16": None}


class LossMismatchError(UserError, ValueError):
  """The peer's first loss is not ours on the same weights and batch: a timing would compare two computations."""


class ParamMismatchError(UserError, ValueError):
  """The peer's parameters after one step are not ours: its optimiser is not the one being compared."""


class DtypeMismatchError(UserError, ValueError):
  """The peer would compute in other dtypes than ours: the timing would compare two precisions."""


class AllocatorMismatchError(UserError, RuntimeError):
  """The workers of one row run with different malloc settings: the row would not compare like with like."""


def check_loss(
  ours: float, theirs: float, tolerance: float = LOSS_TOLERANCE["float32"], peer: str = "the peer"
) -> dict[str, float]:
  """The two first losses and their relative difference; LossMismatchError (naming `peer`) above `tolerance`."""
  rel = abs(ours - theirs) / max(abs(ours), 1e-12)
  if not rel <= tolerance:
    raise LossMismatchError(
      f"{peer}'s first-step loss {theirs:.6f} differs from this project's {ours:.6f} by "
      f"{rel:.2e} (tolerance {tolerance:g}): the Llama checkpoint is not the same model, so "
      "no timing is reported"
    )
  return {"ours": ours, "peer": theirs, "relative_difference": rel, "tolerance": tolerance}


def compare_params(
  ours: dict[str, np.ndarray],
  theirs: dict[str, np.ndarray],
  initial: dict[str, np.ndarray] | None = None,
  tolerance: float = PARAM_TOLERANCE["float32"],
  update_tolerance: float | None = UPDATE_TOLERANCE["float32"],
) -> dict[str, Any]:
  """Parameters of the two sides after the same step, by Llama checkpoint name (ours: `llama.llama_tensors`; the
  peer's: its state_dict as numpy, which may hold more): the worst tensor's max |difference| ÷ its max |parameter|
  and, given the `initial` weights, the worst relative L2 difference of the update itself; ParamMismatchError above
  `tolerance` or `update_tolerance` (None: not checked), or where a name is missing or a shape differs."""
  missing = sorted(set(ours) - set(theirs))
  if missing:
    raise ParamMismatchError(f"the peer has no parameters {missing[:3]}{' ...' * (len(missing) > 3)}")
  out: dict[str, Any] = {
    "tolerance": tolerance,
    "update_tolerance": update_tolerance,
    "relative": 0.0,
    "worst": None,
    "max_abs_diff": 0.0,
  }
  for name, a in ours.items():
    a, b = np.asarray(a, np.float64), np.asarray(theirs[name], np.float64)
    if a.shape != b.shape:
      raise ParamMismatchError(f"the peer's {name} has shape {b.shape}, ours {a.shape}")
    diff = float(np.abs(a - b).max(initial=0.0))
    rel = diff / max(float(np.abs(a).max(initial=0.0)), 1e-12)
    if rel >= out["relative"]:
      out.update(relative=rel, worst=name, max_abs_diff=diff)
    if initial is not None:
      update = a - np.asarray(initial[name], np.float64)
      update_rel = float(np.linalg.norm(a - b) / max(float(np.linalg.norm(update)), 1e-30))
      if update_rel >= out.get("update_relative_l2", 0.0):
        out.update(update_relative_l2=update_rel, worst_update=name)
  if not out["relative"] <= tolerance:
    raise ParamMismatchError(
      f"after one optimiser step the peer's {out['worst']} differs from this project's by "
      f"{out['relative']:.2e} of its largest entry (tolerance {tolerance:g}): the optimisers "
      "(AdamW, clipping, weight decay, learning rate) differ, so no timing is reported"
    )
  if update_tolerance is not None and not out.get("update_relative_l2", 0.0) <= update_tolerance:
    raise ParamMismatchError(
      f"the peer's first update of {out['worst_update']} differs from this project's by "
      f"{out['update_relative_l2']:.2e} of its norm (tolerance {update_tolerance:g}): the "
      "optimisers (AdamW, weight decay, learning rate) differ, so no timing is reported"
    )
  return out


def check_dtypes(ours: dict[str, str], theirs: dict[str, str]) -> dict[str, dict[str, str]]:
  """Both sides' weight and compute dtypes; DtypeMismatchError where they differ."""
  if ours != theirs:
    raise DtypeMismatchError(
      f"the peer would run with {theirs['param']} weights and {theirs['compute']} compute, "
      f"this project with {ours['param']} and {ours['compute']}: a timing would compare two "
      "precisions, so none is reported"
    )
  return {"ours": ours, "peer": theirs}


def check_allocators(requested: str, described: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """The malloc setting every worker of a row reports (`requested` is the row); AllocatorMismatchError where two
  differ."""
  seen = {name: d["allocator"]["setting"] for name, d in described.items()}
  if len(set(seen.values())) > 1:
    raise AllocatorMismatchError(
      f"allocator row {requested!r}: the workers run with different malloc settings "
      f"({', '.join(f'{n}: {v}' for n, v in seen.items())}); no timing is reported"
    )
  return next(iter(described.values()))["allocator"]
