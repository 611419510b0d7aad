"""The kernel cache: a library is loaded only when it matches the hash its build recorded, and a kernel that cannot be
built or loaded is turned off with one warning that says why and what runs instead."""

import ctypes
import hashlib

import pytest

from tapernorm_jax.cpu_kernels import build, matvec
from kernels import needs_compiler


@needs_compiler
def test_a_damaged_or_unrecorded_library_is_built_again_never_loaded(tmp_path, monkeypatch, caplog):
  monkeypatch.setenv("TAPERNORM_CACHE", str(tmp_path))
  built = build.library(matvec.SOURCE)
  record = built.with_name(built.name + ".sha256")
  assert record.read_text().strip() == hashlib.sha256(built.read_bytes()).hexdigest()
  size = built.stat().st_size
  built.write_bytes(built.read_bytes()[: size // 2])  # truncated, as by a full disk or a killed copy
  assert not build.intact(built)
  assert build.library(matvec.SOURCE) == built and build.intact(built) and built.stat().st_size == size
  assert "does not match the hash its build recorded" in caplog.text
  record.unlink()  # a library put there by hand, without its record
  assert build.library(matvec.SOURCE) == built and build.intact(built)
  assert hasattr(ctypes.cdll.LoadLibrary(str(built)), "MatvecRows")


def test_an_unusable_cache_turns_the_kernel_off_with_one_warning(tmp_path, monkeypatch):
  blocked = tmp_path / "a-file"
  blocked.write_text("not a directory")
  monkeypatch.setenv("TAPERNORM_CACHE", str(blocked / "cache"))
  with pytest.warns(RuntimeWarning) as caught:
    why = build.register(matvec.SOURCE, {"tapernorm_test_unused": "MatvecRows"}, without="X runs instead")
  assert f"the kernel cache {blocked / 'cache'} cannot be used" in why and "set TAPERNORM_CACHE" in why
  assert len(caught) == 1 and str(caught[0].message) == f"the CPU kernel matvec_rows.cc is off ({why}); X runs instead"
