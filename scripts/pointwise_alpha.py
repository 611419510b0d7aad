"""The learned α (and Derf's shift) of each point-wise norm of trained DyT/Derf runs, read from their last checkpoint,
beside the pre-logit rms s(h) their metrics logged: α·s(h) far above 1 is a final norm in saturation.

    .venv/bin/python scripts/pointwise_alpha.py runs/tuning/dyt-cpu-aux0-seed0-lr0.003_alpha25x ...

A development tool (the package never imports it); docs/methods/dyt_final_norm/README.md reads its output.
"""

import json
import os
import sys

import jax
import numpy as np
from flax import traverse_util

from tapernorm_jax.inference.loading import load_checkpoint
from tapernorm_jax.runtime import platforms

platforms.without_absent_tpu()


def main(run_dirs: list[str]) -> None:
  """Prints one markdown row per run."""
  header = ["run", "α at init (attn, MLP, final)", "learned α, final norm", "learned α, block norms"]
  header += ["s(h) at steps 49 / 149 / 299", "final α·s(h)"]
  print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
  for run_dir in run_dirs:
    state, config = load_checkpoint(run_dir)
    flat = traverse_util.flatten_dict(jax.device_get(state["params"]))
    alpha = {"/".join(k[:-1]): float(np.asarray(v)) for k, v in flat.items() if k[-1] == "alpha"}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      s_h = {r["step"]: r["s_mean"] for r in map(json.loads, f) if "s_mean" in r}
    blocks = [v for k, v in alpha.items() if k != "final_norm"]
    shown = " / ".join(f"{s_h.get(step, float('nan')):.2f}" for step in (49, 149, 299))
    print(
      f"| `{os.path.basename(run_dir.rstrip('/'))}` | {tuple(config['model']['norm_alpha'])} | "
      f"{alpha['final_norm']:.2f} | {min(blocks):.2f}–{max(blocks):.2f} | {shown} | "
      f"{alpha['final_norm'] * s_h[max(s_h)]:.1f} |"
    )


if __name__ == "__main__":
  main(sys.argv[1:])
