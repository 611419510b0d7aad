"""What faster matrix products could buy a CPU train step: the baseline step as it is, side by side with the same step
whose products (every `cpu_kernels.projection` product) take bfloat16 operands and accumulate in float32, which
XLA:CPU multiplies two to three times as fast as float32 ones here (AVX-512 BF16), conversions included.

    .venv/bin/python scripts/products_bound.py 9m:4x512 30m:1x512

Per cell: how much faster the bf16 products are alone (the step's largest product shapes, interleaved), then the
step's time with each kind of product in interleaved rounds of at least 3 s, and the median of the rounds' ratios.
The step with bf16 products is not a float32 step (its first loss is printed beside the other's): it bounds what any
float32 product of that speed could buy. A development tool: the package never imports it.
"""

import sys
import time

from tapernorm_jax.runtime import allocator

allocator.keep_freed_memory()  # as the entry points set malloc, before jax starts

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from tapernorm_jax.benchmarks import train  # noqa: E402
from tapernorm_jax.benchmarks.pytorch import training  # noqa: E402
from tapernorm_jax.cpu_kernels import projection  # noqa: E402


def bf16_dot(a, b, a_axis: int, b_axis: int):
  """projection._dot with bfloat16 operands and a float32 result."""
  return lax.dot_general(
    a.astype(jnp.bfloat16),
    b.astype(jnp.bfloat16),
    (((a_axis,), (b_axis,)), ((), ())),
    preferred_element_type=jnp.float32,
  )


def compiled_step(cell: str, dot):
  """The baseline trainer's compiled step at `cell` with `dot` as every CPU product, its initial state and a batch."""
  size, B, T = training.parse_cell(cell)
  float32_dot, projection._dot = projection._dot, dot
  try:
    trainer = train.make_trainer("baseline", size, B, T)
    state = trainer.init_state(0)
    batch_BxT1 = np.random.default_rng(0).integers(0, trainer.model_cfg.V, (B, T + 1), dtype=np.int32)
    batch_BxT1 = jax.device_put(batch_BxT1, trainer.batch_sharding)
    return trainer.train_step.lower(state, batch_BxT1).compile(), state, batch_BxT1, trainer.model_cfg
  finally:
    projection._dot = float32_dot


def timed(run, min_s: float) -> float:
  """Seconds per call of `run()` over calls adding up to at least `min_s` (two at least)."""
  start, calls = time.perf_counter(), 0
  while time.perf_counter() - start < min_s or calls < 2:
    run()
    calls += 1
  return (time.perf_counter() - start) / calls


def product_speedups(M: int, D: int, F: int, V: int, rounds: int = 5) -> dict[str, float]:
  """Median over interleaved rounds of float32 time / bf16 time for the step's largest products."""
  rng = np.random.default_rng(0)
  out = {}
  for name, (C, N) in {f"{M}x{D} . {D}x{F} (MLP)": (D, F), f"{M}x{D} . {D}x{V} (logits)": (D, V)}.items():
    x, w = (jnp.asarray(rng.standard_normal(shape, dtype=np.float32)) for shape in ((M, C), (C, N)))
    f32 = jax.jit(lambda x, w: projection._dot(x, w, 1, 0))
    bf16 = jax.jit(lambda x, w: bf16_dot(x, w, 1, 0))
    ratios = [
      timed(lambda: f32(x, w).block_until_ready(), 0.3) / timed(lambda: bf16(x, w).block_until_ready(), 0.3)
      for _ in range(rounds)
    ]
    out[name] = float(np.median(ratios))
  return out


def main(cells: list[str], rounds: int = 5) -> None:
  for cell in cells:
    steps, states = {}, {}
    for name, dot in (("float32", projection._dot), ("bf16", bf16_dot)):
      steps[name], state, batch_BxT1, cfg = compiled_step(cell, dot)
      states[name], metrics = steps[name](state, batch_BxT1)
      print(f"{cell}: first loss with {name} products {float(metrics['loss']):.6f}", flush=True)
    B, T1 = batch_BxT1.shape
    speedups = product_speedups(B * (T1 - 1), cfg.D, cfg.mlp_dim, cfg.V)
    print("  alone: " + ", ".join(f"{name} {s:.2f}x as fast in bf16" for name, s in speedups.items()), flush=True)

    def run(name: str) -> None:
      states[name] = jax.block_until_ready(steps[name](states[name], batch_BxT1)[0])

    ratios = []
    for r in range(rounds):
      times = {
        name: timed(lambda: run(name), 3.0) for name in (("float32", "bf16") if r % 2 == 0 else ("bf16", "float32"))
      }
      ratios.append(times["float32"] / times["bf16"])
      print(
        f"  round {r}: float32 products {1e3 * times['float32']:.0f} ms, bf16 products {1e3 * times['bf16']:.0f} "
        f"ms, step {ratios[-1]:.2f}x as fast",
        flush=True,
      )
    print(
      f"  {cell}: with bf16 products the step is {np.median(ratios):.2f}x as fast "
      f"(median of {rounds} rounds, {min(ratios):.2f}-{max(ratios):.2f})",
      flush=True,
    )


if __name__ == "__main__":
  main(sys.argv[1:])
