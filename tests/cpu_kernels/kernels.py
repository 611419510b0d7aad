"""When the CPU kernels' tests may skip: only where no C++ compiler can build them (a kernel that does not load on
a machine that has one is a failure, not a skip)."""

import os
import shutil

import pytest

COMPILER = os.environ.get("CXX", "c++")
needs_compiler = pytest.mark.skipif(
  shutil.which(COMPILER) is None, reason=f"no C++ compiler ({COMPILER!r}): the CPU kernels cannot be built here"
)
