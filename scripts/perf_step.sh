#!/usr/bin/env bash
# Where a CPU train step's cycles go, by library, from Linux `perf` (needs linux-perf; run from the repo root):
#   scripts/perf_step.sh [CELL=9m:4x512] [SECONDS=15] [KEEP_FREED_MEMORY=1] [CPU_PATHS=auto]
# Runs baseline train steps of CELL for a while, samples both cores with `perf record` for SECONDS, and prints the
# share of cycles per library: XLA's runtime and YNNPACK products (libjax_common.so), XLA's generated fused kernels
# ([JIT]), the fused CPU attention (attention_rows-*.so), the Linux kernel (page faults), libm and libc.
# KEEP_FREED_MEMORY=0 runs with malloc as it is (tapernorm_jax/runtime/allocator.py is what the entry points set). Last line:
# the median step time while sampled; alternate KEEP_FREED_MEMORY=0 and 1 runs to compare the two side by side.
# CPU_PATHS forces the products and attention as train.cpu_paths does (xla: the model's own; kernels: the CPU kernels).
set -euo pipefail
CELL=${1:-9m:4x512}
SECONDS_SAMPLED=${2:-15}
KEEP=${3:-1}
CPU_PATHS=${4:-auto}
PYTHON=${PYTHON:-.venv/bin/python}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

TAPERNORM_KEEP_FREED_MEMORY=$KEEP "$PYTHON" - "$CELL" "$WORK/ready" "$WORK/stop" "$CPU_PATHS" > "$WORK/steps.log" 2>&1 <<'EOF' &
import os, sys, time
from tapernorm_jax.runtime import allocator
allocator.keep_freed_memory()  # before jax is imported, as experiments/__init__.py does
import jax, jax.numpy as jnp, numpy as np
from tapernorm_jax.benchmarks import peer_train, train
size, B, T = peer_train.parse_cell(sys.argv[1])
trainer = train.make_trainer("baseline", size, B, T, cpu_paths=sys.argv[4])
state = trainer.init_state(0)
batch = jnp.asarray(np.random.default_rng(0).integers(0, trainer.model_cfg.V, (B, T + 1), dtype=np.int32))
times = []
while not os.path.exists(sys.argv[3]):
  start = time.perf_counter()
  state, _ = trainer.train_step(state, batch)
  jax.block_until_ready(state)
  times.append(time.perf_counter() - start)
  if len(times) == 3:
    open(sys.argv[2], "w").close()
print(f"median step while sampled: {1e3 * float(np.median(times[3:])):.0f} ms over {len(times) - 3} steps")
EOF
STEPPER=$!
while [ ! -f "$WORK/ready" ]; do
  kill -0 "$STEPPER" 2> /dev/null || { cat "$WORK/steps.log"; exit 1; }
  sleep 1
done
perf record -F 499 -p "$STEPPER" -o "$WORK/perf.data" -- sleep "$SECONDS_SAMPLED" > /dev/null 2>&1
touch "$WORK/stop"
wait "$STEPPER"
echo "cycles by library, baseline train step $CELL, KEEP_FREED_MEMORY=$KEEP, BACKEND_PATHS=$BACKEND_PATHS ($(date -u +%F), $(nproc) cores)"
perf report -i "$WORK/perf.data" --no-children --sort dso --stdio 2> /dev/null | grep -E '^ +[0-9]' \
  | sed -E 's/\[JIT\] tid [0-9]+/[JIT] (XLA fused kernels)/; s/attention_rows-[0-9a-f]+\.so/attention_rows.so (fused attention)/' \
  | head -8
echo "libc's busiest functions (malloc's are _int_malloc, _int_free, malloc_consolidate, unlink_chunk):"
perf report -i "$WORK/perf.data" --no-children --dsos libc.so.6 --sort sym --stdio 2> /dev/null | grep -E '^ +[0-9]' \
  | head -4
tail -1 "$WORK/steps.log"
