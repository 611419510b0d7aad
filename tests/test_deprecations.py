"""The project uses nothing the installed jax has deprecated (each CI run checks its own jax: 0.10 and the newest)."""

import importlib
import re
from locations import ROOT

# Public jax modules that announce deprecated attributes in a module-level `_deprecations` table.
MODULES = (
  "jax",
  "jax.numpy",
  "jax.lax",
  "jax.nn",
  "jax.random",
  "jax.sharding",
  "jax.tree_util",
  "jax.core",
  "jax.experimental",
  "jax.experimental.pallas",
  "jax.extend",
  "jax.ffi",
  "jax.stages",
  "jax.profiler",
)
ALIASES = {"jax.numpy": "jnp"}  # how the project's code spells a module


def deprecated_names() -> list[str]:
  """`module.attribute` for every attribute the installed jax deprecates, as the project's code would spell it."""
  names = []
  for module in MODULES:
    table = getattr(importlib.import_module(module), "_deprecations", {})
    spellings = {module, ALIASES.get(module, module)}
    names += [f"{spelling}.{attribute}" for attribute in table for spelling in spellings]
  return names


def test_no_deprecated_jax_attribute_is_used():
  names = deprecated_names()
  assert names, "no jax module announced deprecations: check MODULES against the installed jax"
  pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in names) + r")\b")
  used = {
    f"{path.relative_to(ROOT)}: {match.group(1)}"
    for folder in ("tapernorm_jax", "experiments", "configs", "scripts", "tests")
    for path in (ROOT / folder).rglob("*.py")
    if path.name != "test_deprecations.py"
    for match in pattern.finditer(path.read_text())
  }
  assert not used, f"deprecated jax attributes in use (the installed jax's announcements): {sorted(used)}"
