"""notebooks/quickstart.ipynb: committed without outputs, and runs top to bottom on CPU at its `ci` size."""

import os
import sys

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def read() -> nbformat.NotebookNode:
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  return nb


def test_committed_without_outputs():
  for i, cell in enumerate(read().cells):
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, (
          f"cell {i} of {NOTEBOOK} holds outputs or an execution count; strip them before committing "
          "(Jupyter: Edit → Clear outputs of all cells)")


def kernel_manager() -> KernelManager:
  """A python3 kernel on this interpreter (ipykernel's own spec: no installed kernelspec can shadow it)."""
  specs = KernelSpecManager(kernel_dirs=[])
  manager = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
  assert manager.kernel_spec.argv[0] == sys.executable
  return manager


def test_runs_top_to_bottom_on_cpu(tmp_path, monkeypatch):
  monkeypatch.setenv("TAPERNORM_NOTEBOOK_SIZE", "ci")
  monkeypatch.setenv("TAPERNORM_NOTEBOOK_WORKDIR", str(tmp_path))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # One CPU device, as a user's kernel has (not the 8 fake devices conftest.py sets for this process), and XLA's
  # backend optimisation off: at the ci size compilation is nearly all of the time, and this halves it.
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform")]
  monkeypatch.setenv("XLA_FLAGS", " ".join([*flags, "--xla_backend_optimization_level=0"]))
  nb = read()
  client = NotebookClient(nb, km=kernel_manager(), timeout=600,
                          resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
  client.execute()  # raises CellExecutionError, with the cell and its traceback, when a cell fails
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "backend cpu" in text and "max |folded − unfolded|" in text
  assert sum("image/png" in o.get("data", {}) for o in outputs) == 4
  for variant in ("baseline", "all_taper"):
    assert os.path.isfile(os.path.join(tmp_path, "ci", variant, "results.json"))
