"""What the report says about the machine, parsed from /proc text."""

from bench.machine import cpu_model, describe, memory_gib
from bench.memory import rss_mib

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor @ 2.10GHz
flags\t\t: fpu

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor @ 2.10GHz
"""


def test_cpu_model_is_the_first_model_name() -> None:
    assert cpu_model(CPUINFO) == "Intel(R) Xeon(R) Processor @ 2.10GHz"
    assert cpu_model("processor : 0\n") == "unknown"


def test_memory_is_memtotal_in_gib() -> None:
    assert memory_gib("MemTotal:       24683520 kB\nMemFree: 1 kB\n") == 24683520 / 1024 / 1024
    assert memory_gib("") == 0.0


def test_rss_is_vmrss_in_mib() -> None:
    assert rss_mib("Name:\tpython\nVmRSS:\t   65536 kB\n") == 64.0


def test_this_machine_is_described() -> None:
    machine = describe()
    assert machine.cores >= 1
    assert machine.python.count(".") == 2
