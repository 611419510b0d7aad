"""Which tapered norm's fixed map costs a trained run its loss: its last checkpoint's validation loss at g = 0, and
again with one tapered norm at a time (then all of them) given back its normalization at the same average gain.

A tapered norm at g = 0 is the fixed map c·h̄⊙γ̃: it passes on every token's scale as it comes. Swapped back, the norm
divides each token by its own rms s(h) and multiplies by c·s̄·γ̃, s̄ being the mean s(h) of that norm's input over these
windows, so on average the two maps agree and only the per-token scale differs. A swap that lowers the loss a lot
points at the norm whose input's per-token scale the fixed map should not have passed on.

    .venv/bin/python scripts/norm_swap.py runs/budgets-tpp20-gain3/internal_taper-cpu_xl@tpp20-aux1-seed0

A development tool (the package never imports it); docs/budgets/tpp20/checks.md reads its output.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

import flax.linen as nn

from tapernorm_jax import data
from tapernorm_jax.hf import pretrained
from tapernorm_jax.inference.loading import load_checkpoint
from tapernorm_jax.model import ModelConfig, Transformer, param_paths
from tapernorm_jax.model.gates import Gates
from tapernorm_jax.model.norms import CALIB_STATS
from tapernorm_jax.runtime import platforms

platforms.without_absent_tpu()


def gates_with(L: int, swapped: list[param_paths.Path]) -> Gates:
  """Gates at 0 but 1 at every norm of `swapped` (block norms only: the final norm stays as it is)."""
  attn, mlp = np.zeros(L, np.float32), np.zeros(L, np.float32)
  for block, name in swapped:
    (attn if name == param_paths.ATTN_NORM else mlp)[int(block.split("_")[1])] = 1.0
  return Gates(attn=jnp.asarray(attn), mlp=jnp.asarray(mlp), final=jnp.float32(0.0))


def mean_loss(model: Transformer, variables: dict, gates: Gates, windows_NxT1: np.ndarray) -> float:
  """Mean next-token cross-entropy over the windows at `gates`."""
  logits_NxTxV = model.apply(variables, jnp.asarray(windows_NxT1[:, :-1]), gates)
  logp_NxTxV = jax.nn.log_softmax(logits_NxTxV.astype(jnp.float32))
  return float(-jnp.take_along_axis(logp_NxTxV, jnp.asarray(windows_NxT1[:, 1:, None]), -1).mean())


def input_scales(variables: dict, model_cfg: ModelConfig, windows_NxT1: np.ndarray) -> dict:
  """Each block norm's s̄, the mean rms of its input over the windows (position 0 left out), at g = 0; a run with
  plain norms is read as tapered at g = 1, which computes the same model and records the same statistic."""
  if model_cfg.internal_norm == "plain":
    model_cfg = model_cfg.replace(internal_norm="taper")
    fresh = Transformer(model_cfg).init(jax.random.key(0), jnp.asarray(windows_NxT1[:1, :-1]))
    variables = {"params": pretrained.merge(nn.unbox(fresh["params"]), variables["params"]), "calib": fresh["calib"]}
    gates = Gates.uniform(1.0, model_cfg.L)
  else:
    gates = Gates.uniform(0.0, model_cfg.L)
  _, stats = Transformer(model_cfg).apply(variables, jnp.asarray(windows_NxT1[:, :-1]), gates, mutable=[CALIB_STATS])
  flat = traverse_util.flatten_dict(stats[CALIB_STATS])
  return {path[:-1]: float(value) for path, value in flat.items() if path[-1] == param_paths.S}


def main(run_dir: str) -> None:
  """Prints the table."""
  variables, cfg = load_checkpoint(run_dir)
  model_cfg = ModelConfig.from_config(cfg["model"])
  prepared = data.prepare(cfg["data"])
  B, T, n = cfg["train"]["batch_size"], model_cfg.T, cfg["train"]["eval_batches"]
  windows_NxT1 = np.concatenate(list(data.eval_batches(prepared, B, T, n)))
  scales = input_scales(variables, model_cfg, windows_NxT1)
  print(f"{run_dir} at step {cfg['restored_step']}: {len(windows_NxT1)} validation windows of {T + 1} tokens")
  if model_cfg.internal_norm == "plain":
    print("| norm | s̄ of its input now |\n|---|---|")
    for norm, s in scales.items():
      print(f"| {'/'.join(norm)} | {s:.4g} |")
    return
  norms = [norm for norm in param_paths.norms_in(model_cfg) if norm[0] != param_paths.FINAL_NORM]
  model, at_zero = Transformer(model_cfg), Gates.uniform(0.0, model_cfg.L)
  flat_params = traverse_util.flatten_dict(variables["params"])
  flat_calib = traverse_util.flatten_dict(variables["calib"])

  def matched(swapped: list[param_paths.Path]) -> dict:
    """The variables with each swapped norm's γ set to c·s̄·γ̃."""
    params = dict(flat_params)
    for norm in swapped:
      c = flat_calib[norm + (param_paths.C,)]
      params[norm + (param_paths.GAMMA,)] = c * scales[norm] * flat_params[norm + (param_paths.GAMMA_TILDE,)]
    return {**variables, "params": traverse_util.unflatten_dict(params)}

  rms = lambda x: float(np.sqrt(np.mean(np.square(x))))
  header = (
    "| norm normalized again | c | 1/c (≈ s̄ at calibration) | s̄ of its input now | rms γ̃ | c·s̄·rms γ̃ | val loss |"
  )
  print(header + "\n" + "|---" * (header.count("|") - 1) + "|")
  print(f"| none (the run at g = 0) | | | | | | {mean_loss(model, variables, at_zero, windows_NxT1):.4f} |")
  for norm in norms:
    c, s = float(flat_calib[norm + (param_paths.C,)]), scales[norm]
    gamma_tilde = rms(flat_params[norm + (param_paths.GAMMA_TILDE,)])
    loss = mean_loss(model, matched([norm]), gates_with(model_cfg.L, [norm]), windows_NxT1)
    cells = [f"{c:.4g}", f"{1 / c:.3g}", f"{s:.4g}", f"{gamma_tilde:.3g}", f"{c * s * gamma_tilde:.3g}", f"{loss:.4f}"]
    print(f"| {'/'.join(norm)} | " + " | ".join(cells) + " |")
  every = mean_loss(model, matched(norms), gates_with(model_cfg.L, norms), windows_NxT1)
  print(f"| all {len(norms)} | | | | | | {every:.4f} |")


if __name__ == "__main__":
  main(sys.argv[1])
