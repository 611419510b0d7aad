"""Test setup: 8 fake CPU devices, so sharding bugs show up without an accelerator, unless a backend is asked for.

`TAPERNORM_TEST_BACKEND` asks for one: `default` leaves the choice to jax (the accelerator on a GPU/TPU
host), any other value is passed on as JAX_PLATFORMS (`cpu`, `cuda`, `tpu`); float32 products then run at
full precision (no TF32). Unset, the tests run on 8 fake CPU devices (a JAX_PLATFORMS already set is
kept). With `TAPERNORM_TEST_DEVICES_DIR` set, every test process (each xdist worker, not the controller)
writes the devices it ran on there, one JSON file per process: the accelerator check reads them to prove
where its tests ran.

Tests pin the CPU paths a Trainer runs to the kernels (`TAPERNORM_CPU_PATHS=kernels`: the most code, and numbers
that do not depend on a host's timing); tests/cpu_kernels/test_autotune.py tests the timing that `auto` does.

Every test process keeps its cache (`TAPERNORM_CACHE`: prepared corpora, the compiled decode kernel) in its
own pytest temporary directory, so no test writes to ~/.cache.
"""

import json
import os

os.environ.setdefault("TAPERNORM_CPU_PATHS", "kernels")

BACKEND = os.environ.get("TAPERNORM_TEST_BACKEND", "")
if not BACKEND:
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
elif BACKEND != "default":
  os.environ["JAX_PLATFORMS"] = BACKEND

import jax  # noqa: E402

from tapernorm_jax.runtime import hardware  # noqa: E402

if not BACKEND:
  jax.config.update("jax_num_cpu_devices", 8)
elif "JAX_DEFAULT_MATMUL_PRECISION" not in os.environ:
  # float32 comparisons assume float32 products; GPUs would otherwise use TF32 (10-bit mantissas) for them
  jax.config.update("jax_default_matmul_precision", "highest")


def pytest_sessionstart(session) -> None:
  """Points the cache into this session's temporary directory, before collection imports anything that builds (the
  decode kernel's availability is probed at import); records the devices this process's tests run on, when asked
  to (TAPERNORM_TEST_DEVICES_DIR)."""
  basetemp = session.config._tmp_path_factory.getbasetemp()  # noqa: SLF001 (the tmp_path_factory fixture's own)
  os.environ["TAPERNORM_CACHE"] = str(basetemp / "cache")
  out_dir = os.environ.get("TAPERNORM_TEST_DEVICES_DIR")
  xdist_controller = getattr(session.config.option, "numprocesses", None) and not hasattr(session.config, "workerinput")
  if out_dir and not xdist_controller:  # an xdist controller runs no tests (and must not take the accelerator)
    os.makedirs(out_dir, exist_ok=True)
    record = {
      "pid": os.getpid(),
      "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
      "devices": [str(d) for d in jax.devices()],
      **hardware.describe(),
    }
    with open(os.path.join(out_dir, f"{record['worker']}-{record['pid']}.json"), "w") as f:
      json.dump(record, f)
