"""Fixtures of the study tests."""

import pytest


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
  """A data directory shared by a module's tiny sweeps (the synthetic corpus is prepared once)."""
  return str(tmp_path_factory.mktemp("data"))
