"""An independent count of a train step's device-memory traffic on one chip, from the model's shapes alone: what the
optimizer, the weights, the activations and the logits must move with every elementwise operation fused into its
neighbours. It is a floor to read the compiler's count (`hlo.hbm_bytes`, every top-level operation's operands and
results) against, not a second cost model: where the two differ by several times, the difference is in how the
compiler built the program (partial products, copies, unfused operations), not in what the model needs.

What each term counts (bytes per chip per step; weights in float32, activations in the compute dtype):
  optimizer    once a step, this chip's 1/fsdp shard of the parameters: AdamW reads the parameter, its gradient and
               both moments and writes the parameter and the moments (28 bytes a parameter), the clip reads the
               gradient again (4), and every microbatch after the first adds its gradient to the sum (8)
  weights      every microbatch, each matrix: gathered in the compute dtype for the forward and again for the
               backward (two writes), read by the forward product and by the input-gradient product, its float32
               gradient written and read by the reduce-scatter; `full` remat gathers and reads it once more
  activations  every token, every block: the tensors a pre-norm block writes (two norm outputs, q, k, v, the
               attention output and its projection, two residual sums, the MLP's hidden tensors and its output),
               each written and read once forward, and read again with its gradient written and read backward
               (5 accesses); `full` remat writes and reads them once more. Attention's scores stay on chip.
  logits       every token: V float32 logits written and read by the log-softmax and read by its gradient, which
               writes V gradients in the compute dtype that the head's two products read
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax

from tapernorm_jax.model import ModelConfig, abstract_variables

F32 = 4


@dataclasses.dataclass(frozen=True)
class Traffic:
  """Bytes one chip moves in one train step, by what moves them."""

  optimizer: float
  weights: float
  activations: float
  logits: float

  @property
  def total(self) -> float:
    """All four terms."""
    return self.optimizer + self.weights + self.activations + self.logits


def block_tensors(cfg: ModelConfig) -> int:
  """Elements a pre-norm block writes per token: 10 of width D (norms, q, k, v, attention, its projection, MLP
  output, two residual sums) and the MLP's hidden ones (SwiGLU: gate, up, their product; GELU: up, its
  activation)."""
  return 10 * cfg.D + (3 if cfg.family == "llama" else 2) * cfg.mlp_dim


def train_step_traffic(
  model: ModelConfig | Mapping[str, Any], batch_size: int, microbatches: int, fsdp: int, chips: int
) -> Traffic:
  """The least device-memory traffic of one train step on one chip (see the module docstring): `batch_size` rows
  of model.T tokens split over `chips`, parameters sharded `fsdp` ways."""
  cfg = ModelConfig.from_config(model).for_platform("tpu")
  leaves = jax.tree.leaves(nn.unbox(abstract_variables(cfg)["params"]))
  params = sum(x.size for x in leaves)
  matrices = sum(x.size for x in leaves if x.ndim >= 2)
  act = cfg.compute_dtype.itemsize
  tokens = batch_size * cfg.T / chips
  passes = 3 if cfg.remat == "full" else 2  # how often each weight is gathered and read by a forward product
  return Traffic(
    optimizer=params / fsdp * (F32 * 8 + 2 * F32 * (microbatches - 1)),
    weights=microbatches * matrices * (passes * 2 * act + 2 * F32),
    activations=tokens * cfg.L * block_tensors(cfg) * act * (7 if cfg.remat == "full" else 5),
    logits=tokens * cfg.V * (3 * F32 + 3 * act),
  )


def for_results(results: Mapping[str, Any]) -> Traffic:
  """The count for the train step a compile check's `results.json` describes."""
  run = results["run"]
  return train_step_traffic(
    run["model"], run["batch_size"], run["microbatches"], results["mesh"]["fsdp"], results["chips"]
  )
