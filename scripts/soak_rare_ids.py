"""Why a run's validation loss at g = 0 overflows while its training loss does not: its last checkpoint's validation
windows at g = 0, grouped by the rarest token id they hold (its count in the training stream), the tied embedding
rows' norms by the same counts, and the whole loss again with the rare ids' embedding rows set to the mean row.

    .venv/bin/python scripts/soak_rare_ids.py runs/soak-1m

A development tool (the package never imports it); docs/guarantees.md (the 1M soak) reads its output.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from tapernorm_jax import data
from tapernorm_jax.inference.loading import load_checkpoint
from tapernorm_jax.model import ModelConfig, Transformer, param_paths
from tapernorm_jax.runtime import platforms

platforms.without_absent_tpu()
RARE = 20  # an id the training stream holds fewer times than this is rare
GROUPS = (
  ("an id never in training", 0, 1),
  (f"an id seen 1–{RARE - 1} times", 1, RARE),
  ("only ids seen more", RARE, None),
)  # (name, lowest count, count bound or None)


def window_losses(model: Transformer, variables: dict, windows_NxT1: np.ndarray) -> np.ndarray:
  """Mean next-token cross-entropy of each window at g = 0 (N,)."""

  @jax.jit
  def loss_B(tokens_BxT1: jax.Array) -> jax.Array:
    logits_BxTxV = model.apply(variables, tokens_BxT1[:, :-1], 0.0)
    logp_BxTxV = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32))
    return -jnp.take_along_axis(logp_BxTxV, tokens_BxT1[:, 1:, None], -1)[..., 0].mean(-1)

  return np.concatenate([np.asarray(loss_B(jnp.asarray(w))) for w in np.array_split(windows_NxT1, 8)])


def main(run_dir: str) -> None:
  """Prints the tables."""
  variables, cfg = load_checkpoint(run_dir)
  model_cfg = ModelConfig.from_config(cfg["model"])
  prepared = data.prepare(cfg["data"])
  counts_V = np.bincount(prepared.tokens("train"), minlength=model_cfg.V)
  B, T, n = cfg["train"]["batch_size"], model_cfg.T, cfg["train"]["eval_batches"]
  windows_NxT1 = np.concatenate(list(data.eval_batches(prepared, B, T, n)))
  rarest_N = counts_V[windows_NxT1].min(-1)
  model = Transformer(model_cfg)
  print(f"{run_dir} at step {cfg['restored_step']}: {len(windows_NxT1)} validation windows of {T + 1} tokens, g = 0")
  embed_VxD = np.asarray(variables["params"][param_paths.EMBED])
  norms_V = np.linalg.norm(embed_VxD, axis=-1)
  losses_N = window_losses(model, variables, windows_NxT1)
  header = ["windows holding", "windows", "mean loss", "max loss", "embedding rows", "median row norm"]
  print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
  for name, lo, hi in GROUPS:
    in_N = (rarest_N >= lo) & (rarest_N < hi if hi else True)
    ids_V = (counts_V >= lo) & (counts_V < hi if hi else True)
    mean, top = (np.mean(losses_N[in_N]), np.max(losses_N[in_N])) if in_N.any() else (np.nan, np.nan)
    print(f"| {name} | {in_N.sum()} | {mean:.4g} | {top:.4g} | {ids_V.sum()} | {np.median(norms_V[ids_V]):.3g} |")
  print(f"all windows: {losses_N.mean():.4g}")
  rare_V = counts_V < RARE
  mean_row_D = embed_VxD[~rare_V].mean(0)
  reset_VxD = np.where(rare_V[:, None], mean_row_D, embed_VxD)
  reset = {**variables, "params": {**variables["params"], param_paths.EMBED: reset_VxD}}
  reset_loss = window_losses(model, reset, windows_NxT1).mean()
  print(f"all windows, every rare id's row set to the mean of the others: {reset_loss:.4g}")


if __name__ == "__main__":
  main(sys.argv[1])
