"""Which of jax's platforms an entry point lets jax start: without a TPU on the host, not the TPU one.

The `test` extra installs libtpu (the TPU compiler, for compile checks from any host). Where it is installed and the
host has no TPU, jax still tries to start a TPU backend at its first use and libtpu prints several lines of start-up
errors before anything of the run. An entry point run without `JAX_PLATFORMS` therefore sets it, before jax is
imported, to the GPU platforms whose plugins are installed and whose devices are present (CUDA, ROCm) and the CPU,
leaving out TPU when no TPU chip is on the host's PCI bus. A `JAX_PLATFORMS` the user set is kept as it is.
Imports nothing of jax.
"""

import glob
import importlib.util
import os

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips on the PCI bus (what jax's own TPU detection reads)
# a GPU platform: its jax plugins (one installed) and its device nodes (one present)
GPU_PLATFORMS = {
  "cuda": (("jax_cuda13_plugin", "jax_cuda12_plugin"), "dev/nvidia[0-9]*"),
  "rocm": (("jax_rocm7_plugin", "jax_rocm60_plugin"), "dev/kfd"),
}


def tpu_on_host(sys_root: str = "/") -> bool:
  """Whether a TPU chip is on this host: a Google PCI device, or an accelerator device node."""
  for vendor_file in glob.glob(os.path.join(sys_root, "sys/bus/pci/devices/*/vendor")):
    try:
      with open(vendor_file) as f:
        if f.read().strip() == GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return bool(glob.glob(os.path.join(sys_root, "dev/accel*")))


def without_absent_tpu(environ: dict[str, str] | None = None, sys_root: str = "/") -> str:
  """Sets `JAX_PLATFORMS` in `environ` (default: this process's) to the present GPU platforms and the CPU where
  it is unset, libtpu is installed and the host has no TPU; returns why it was left alone, "" where it was set."""
  environ = os.environ if environ is None else environ
  if "JAX_PLATFORMS" in environ:
    return "JAX_PLATFORMS is set"
  if importlib.util.find_spec("libtpu") is None:
    return "libtpu is not installed"
  if tpu_on_host(sys_root):
    return "this host has a TPU"
  gpus = [
    name
    for name, (modules, nodes) in GPU_PLATFORMS.items()
    if any(importlib.util.find_spec(m) for m in modules) and glob.glob(os.path.join(sys_root, nodes))
  ]
  environ["JAX_PLATFORMS"] = ",".join([*gpus, "cpu"])
  return ""
