"""Two versions of the fused CPU attention side by side: forward and forward + backward, interleaved rounds.

    git show f3c0792~1:tapernorm_jax/cpu_kernels/attention_rows.cc > /tmp/old/attention_rows.cc
    .venv/bin/python scripts/ab_attention.py 4,512,16,16 /tmp/old/attention_rows.cc \
        tapernorm_jax/cpu_kernels/attention_rows.cc

Each source is built as cpu_kernels/build.py builds the package's own (cached) and registered under its own FFI
target names, so both run in one process on the same inputs (B,T,H,K), checked to agree first. Prints the median
time of each over the rounds and the median of the per-round ratios to the first source. A development tool: the
package never imports it.
"""

import ctypes
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tapernorm_jax.cpu_kernels import attention, build


def attend_from(source: str, suffix: str):
  """`attention.causal_attention` computed by the kernels built from `source`, registered with `suffix`."""
  library = ctypes.cdll.LoadLibrary(str(build.library(Path(source), attention.FLAGS)))
  for target, symbol in attention.TARGETS.items():
    jax.ffi.register_ffi_target(target + suffix, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
  return lambda q, k, v: attention.attend_prescaled(q * jnp.float32(q.shape[-1] ** -0.5), k, v, suffix)


def median_ms(f, *args, calls: int = 10) -> float:
  """Median wall time of `calls` calls after one warm-up."""
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * float(np.median(times))


def main(shape: str, sources: list[str], rounds: int = 7) -> None:
  B, T, H, K = (int(x) for x in shape.split(","))
  rng = np.random.default_rng(0)
  q, k, v, dout = (jnp.asarray(rng.standard_normal((B, T, H, K), dtype=np.float32)) for _ in range(4))
  versions = []
  for i, source in enumerate(sources):
    attend = attend_from(source, f"_ab{i}")
    versions.append((jax.jit(attend), jax.jit(lambda q, k, v, dout, a=attend: jax.vjp(a, q, k, v)[1](dout))))
  first = np.asarray(versions[0][0](q, k, v))
  for forward, _ in versions[1:]:
    np.testing.assert_allclose(np.asarray(forward(q, k, v)), first, atol=1e-5)
  times = np.array(
    [[(median_ms(f, q, k, v), median_ms(g, q, k, v, dout)) for f, g in versions] for _ in range(rounds)]
  )  # rounds × versions × (forward, forward + backward)
  print(
    f"B,T,H,K = {shape}, {rounds} interleaved rounds (median ms; ratio = median of the rounds' ratios to the first)"
  )
  for i, source in enumerate(sources):
    ratio = np.median(times[:, 0] / times[:, i], axis=0)
    print(
      f"  {source}: forward {np.median(times[:, i, 0]):.2f} ms ({ratio[0]:.2f}x), "
      f"forward + backward {np.median(times[:, i, 1]):.2f} ms ({ratio[1]:.2f}x)"
    )


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
