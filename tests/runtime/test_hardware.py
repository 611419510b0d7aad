"""What a measurement records of its host: the exact CPU (vendor, family, model, stepping, ISA), cores, versions."""

from tapernorm_jax.runtime import hardware

# The first processor of an Intel Sapphire Rapids guest's /proc/cpuinfo (abridged), then a second processor
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
stepping\t: 8
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8

processor\t: 1
vendor_id\t: AuthenticAMD
model\t\t: 1
"""


def test_the_cpu_identity_is_read_from_the_first_processor():
  ident = hardware.cpu_identity(SAPPHIRE_RAPIDS)
  assert ident == {
    "vendor": "GenuineIntel",
    "family": 6,
    "model": 143,
    "stepping": 8,
    "model_name": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
    "isa": ["AVX2", "FMA", "AVX-512", "AVX512-BF16", "AVX512-VNNI", "AMX", "AMX-BF16"],
  }
  old = hardware.cpu_identity("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 63\nflags\t\t: sse2 avx\n")
  assert old["isa"] == [] and old["stepping"] is None and old["model"] == 63


def test_a_cpu_record_names_the_exact_host_in_one_line():
  hw = {
    "backend": "cpu",
    "cpu": "Intel(R) Xeon(R) Processor",
    "cpu_count": 2,
    "l3_cache": "105M",
    "cpu_identity": hardware.cpu_identity(SAPPHIRE_RAPIDS),
    "isa_limit": "",
  }
  assert hardware.one_line(hw) == (
    "Intel(R) Xeon(R) Processor (GenuineIntel family 6 model 143 stepping 8; AVX2 FMA "
    "AVX-512 AVX512-BF16 AVX512-VNNI AMX AMX-BF16), 2 cores, L3 105M"
  )
  older = {k: v for k, v in hw.items() if k != "cpu_identity"}  # result files written before the identity
  assert hardware.one_line(older) == "Intel(R) Xeon(R) Processor, 2 cores, L3 105M"
  here = hardware.describe()
  assert here["usable_cores"] >= 1 and here["libraries"]["jax"] == here["jax"] and "jaxlib" in here["libraries"]
