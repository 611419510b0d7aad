"""notebooks/quickstart.ipynb: committed without outputs, runs top to bottom on CPU at its `ci` size, and its install
cell fits the project to the jax a runtime already has."""

import os
import pathlib
import subprocess
import sys
import sysconfig
import venv

import jax
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from locations import ROOT

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
        "(Jupyter: Edit → Clear outputs of all cells)"
      )


def kernel_manager() -> KernelManager:
  """A python3 kernel on this interpreter (ipykernel's own spec: no installed kernelspec can shadow it)."""
  specs = KernelSpecManager(kernel_dirs=[])
  manager = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
  assert manager.kernel_spec.argv[0] == sys.executable
  return manager


@pytest.mark.slow  # 25–80 s on 2 cores: CI runs it after the default suite
def test_runs_top_to_bottom_on_cpu(tmp_path, monkeypatch):
  monkeypatch.setenv("TAPERNORM_NOTEBOOK_SIZE", "ci")
  monkeypatch.setenv("TAPERNORM_NOTEBOOK_WORKDIR", str(tmp_path))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  # One CPU device, as a user's kernel has (not the 8 fake devices conftest.py sets for this process), and XLA's
  # backend optimisation off: at the ci size compilation is nearly all of the time, and this halves it.
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform")]
  monkeypatch.setenv("XLA_FLAGS", " ".join([*flags, "--xla_backend_optimization_level=0"]))
  nb = read()
  client = NotebookClient(
    nb, km=kernel_manager(), timeout=600, resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}
  )
  client.execute()  # raises CellExecutionError, with the cell and its traceback, when a cell fails
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "backend cpu" in text and "max |folded − unfolded|" in text
  assert sum("image/png" in o.get("data", {}) for o in outputs) == 4
  for variant in ("baseline", "all_taper"):
    assert os.path.isfile(os.path.join(tmp_path, "ci", variant, "results.json"))


def install_cell() -> str:
  """The source of the notebook's install cell (the code cell that calls pip)."""
  return next(cell.source for cell in read().cells if cell.cell_type == "code" and "pip" in cell.source)


def run_install_cell(python: str, **env: str) -> subprocess.CompletedProcess:
  """The install cell as a script, from notebooks/ as a kernel opened there runs it."""
  return subprocess.run(
    [python, "-c", install_cell()],
    cwd=os.path.dirname(NOTEBOOK),
    capture_output=True,
    text=True,
    timeout=600,
    env={**os.environ, **env},
  )


def test_install_cell_keeps_the_runtime_jax_and_installs_the_project(tmp_path):
  # A runtime that has jax (this interpreter's: 0.10 on the Python 3.11 lock, the newest line on 3.13) and the
  # project's other dependencies, but not the project: a venv that sees this one's site-packages as a plain path,
  # so the packages are there and this checkout's editable install is not. pip works offline: nothing to download.
  runtime = tmp_path / "runtime"
  venv.create(runtime, with_pip=False)
  python = str(runtime / "bin" / "python")
  site = subprocess.run(
    [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
    capture_output=True,
    text=True,
    check=True,
  ).stdout.strip()
  pathlib.Path(site, "runtime_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  before = subprocess.run([python, "-c", "import jax, tapernorm_jax"], cwd=tmp_path, capture_output=True, text=True)
  assert "No module named 'tapernorm_jax'" in before.stderr  # jax is there, the project is not
  done = run_install_cell(python, PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0")
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  assert f"jax=={jax.__version__}" in done.stdout and f"jax {jax.__version__}: backend" in done.stdout
  probe = subprocess.run(
    [
      python,
      "-c",
      "import importlib.metadata as m, tapernorm_jax; "
      "print(m.version('jax'), m.distribution('tapernorm_jax').locate_file(''))",
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
  )
  assert probe.returncode == 0, probe.stderr[-3000:]
  version, location = probe.stdout.split()
  assert version == jax.__version__ and pathlib.Path(location).resolve() == pathlib.Path(site).resolve()


def test_install_cell_does_nothing_where_the_project_is_installed():
  done = run_install_cell(sys.executable)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "pip install" not in done.stdout and f"jax {jax.__version__}: backend" in done.stdout
