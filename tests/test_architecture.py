"""The packages import one way, exactly as docs/architecture.md's table says: no circle between packages or modules,
each layer importing only the layers above it, the tokenizers and the hub client no jax, no module past 400 lines."""

import ast
import pathlib
import re
import subprocess
import sys

from locations import ROOT

PACKAGE = ROOT / "tapernorm_jax"


def package_of(module: str) -> str | None:
  """`model` for tapernorm_jax.model.x; the module's own name for a top-level module; None outside the project."""
  parts = module.split(".")
  if parts[0] != "tapernorm_jax" or len(parts) == 1:
    return None
  return parts[1]


def imports() -> dict[str, set[str]]:
  """Package (or top-level module) → the project's packages and modules it imports, from the source."""
  edges: dict[str, set[str]] = {}
  for path in PACKAGE.rglob("*.py"):
    relative = path.relative_to(PACKAGE).parts
    source = relative[0].removesuffix(".py")
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tapernorm_jax"):
        modules = (
          [node.module] if node.module != "tapernorm_jax" else [f"tapernorm_jax.{alias.name}" for alias in node.names]
        )
        edges.setdefault(source, set()).update(t for m in modules if (t := package_of(m)) not in (None, source))
  return edges


def documented_layers() -> list[tuple[str, set[str]]]:
  """docs/architecture.md's table: (package or module, what it imports), layer by layer from the top."""
  rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (.*) \|$", (ROOT / "docs" / "architecture.md").read_text(), re.M)
  assert [int(n) for n, _, _ in rows] == list(range(1, len(rows) + 1)), "the table's layers are not 1, 2, 3, ..."
  return [(name, set(re.findall(r"`(\w+)`", imported))) for _, name, imported in rows]


def test_the_documented_table_is_the_import_graph_and_each_layer_imports_only_those_above():
  layers, edges = documented_layers(), imports()
  names = [name for name, _ in layers]
  top = {
    p.stem if p.is_file() else p.name
    for p in PACKAGE.iterdir()
    if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
  }
  assert set(names) == top, f"in the code, not the table: {top - set(names)}; in the table only: {set(names) - top}"
  for i, (name, documented) in enumerate(layers):
    actual = edges.get(name, set())
    assert actual == documented, f"{name} imports {sorted(actual)}; docs/architecture.md says {sorted(documented)}"
    below = documented - set(names[:i])
    assert not below, f"{name} (layer {i + 1}) imports {sorted(below)}, which sit below it"


def module_imports() -> dict[str, set[str]]:
  """Module → the project's modules it imports (`from pkg import mod` is an import of pkg.mod), TYPE_CHECKING
  imports included: a circle only a type checker sees is still a circle."""
  modules = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(ROOT).with_suffix("").parts
    modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  edges = {}
  for name, path in modules.items():
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tapernorm_jax"):
        targets |= {
          f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
        }
      elif isinstance(node, ast.Import):
        targets |= {a.name for a in node.names if a.name.startswith("tapernorm_jax")}
    # a package's __init__ re-exporting its own modules is its interface, not a circle
    edges[name] = {t for t in targets if t in modules and t != name and not t.startswith(name + ".")}
  return edges


def test_no_module_imports_itself_round_a_circle():
  edges, done, path = module_imports(), set(), []

  def visit(node: str) -> None:
    assert node not in path, f"import circle: {' → '.join(path[path.index(node) :] + [node])}"
    if node in done:
      return
    path.append(node)
    for target in sorted(edges[node]):
      visit(target)
    path.pop()
    done.add(node)

  for node in sorted(edges):
    visit(node)


def test_tokenizers_and_the_hub_client_import_without_jax():
  script = (
    "import sys\nimport tapernorm_jax.tokenizers.sentencepiece, tapernorm_jax.tokenizers.gpt2_bpe, "
    "tapernorm_jax.hf.hub\nprint(sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules))"
  )
  done = subprocess.run(
    [sys.executable, "-c", script], cwd=pathlib.Path(ROOT), capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == "[]"


def test_the_model_never_asks_the_host_which_backend_it_has():
  """Device choices follow the target (`ModelConfig.platform`, from the mesh), never `jax.default_backend()`."""
  calls = [
    f"{path.relative_to(ROOT)}:{node.lineno}"
    for path in (PACKAGE / "model").rglob("*.py")
    for node in ast.walk(ast.parse(path.read_text()))
    if isinstance(node, ast.Attribute) and node.attr in ("default_backend", "backend")
  ]
  assert calls == []


def test_no_module_runs_past_400_lines():
  long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
  assert not long, f"split these by concern: {long}"
