"""Whether --xla_cpu_max_isa holds XLA's matrix products: the 2048³ float32 GEMM rate under each limit."""
import json, os, subprocess, sys
rows = []
for rep in range(3):
  for isa in ("SSE4_2", "AVX2", ""):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_cpu_max_isa={isa}" if isa else ""}
    out = subprocess.run([sys.executable, "-c", "import json; from tapernorm_jax.runtime import hardware; "
                          "print(json.dumps({'flops': hardware.measured_gemm_flops(), 'hw': hardware.describe()}))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    got = json.loads(out)
    rows.append({"round": rep, "xla_cpu_max_isa": isa or "(none)", "gflops": got["flops"] / 1e9})
    hw = got["hw"]
print(json.dumps({"command": "python docs/benchmarks_results/isa_limit/measure.py", "hardware": hw,
                  "rows": rows}, indent=1))
