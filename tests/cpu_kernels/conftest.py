"""Shared by the CPU kernels' tests."""

import pytest

from tapernorm_jax.cpu_kernels import attention, matvec


@pytest.fixture
def reload_kernels():
  """Lets a test change how the kernels load (environment, compiler); the next user loads them afresh."""
  loaders = (matvec._load, attention._load)
  for load in loaders:
    load.cache_clear()
  yield
  for load in loaders:
    load.cache_clear()
