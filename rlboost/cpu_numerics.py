"""The same CPU arithmetic on every x86 machine: the instruction set torch, MKL and oneDNN may use, pinned to AVX2.

torch picks its CPU kernels by what the processor offers (AVX2, AVX-512), and so do MKL and oneDNN. Wider vectors
sum in another order, so the same job's weights differ in the last bits after a few steps on an AVX-512 machine:
the default job's final weights checksum did (2026-11-24, AMD EPYC with AVX-512: 704ae64b... in place of the
b5b6db41... the earlier machines gave, the pin until trainer.sharePrompts; `ATEN_CPU_CAPABILITY=avx2` alone brought
it back). rlboost promises one result per job on every fresh machine (the pinned checksum, bit-exact resume, greedy rollouts identical when a
response migrates between workers on different nodes), so every CPU torch process starts with these defaults: the
`rlboost` command itself (it draws the tiny model's initial weights, and that random draw differs by ISA too;
rlboost.cli.main), the local trainer and workers (rlboost.local.plan), and the CPU images' processes (their
Dockerfiles). A variable the user sets wins: `ATEN_CPU_CAPABILITY=avx512` buys speed and gives up identity with
other machines. Thread counts are not pinned (1 and 2 trainer threads gave the same checksum): docs/architecture.md.

The promise holds per processor vendor, not across vendors: an Intel Xeon with AVX-512 (2026-11-28) ends the default
job on another checksum than every AMD machine (`cpu_vendor` tells which applies), also with MKL_CBWR=COMPATIBLE.
MKL, torch's BLAS here, promises its reproducible branches on Intel processors; on others it takes kernels of its
own. Within a vendor the checksum held on every machine measured.
"""

from __future__ import annotations

from pathlib import Path

# Variable -> value. ATen's dispatch level, MKL's Conditional Numerical Reproducibility branch, oneDNN's ISA ceiling.
CPU_NUMERICS_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This machine's processor vendor as the kernel reports it ('GenuineIntel', 'AuthenticAMD'); '' where unknown
    (not Linux, or no vendor line): the default job's pinned checksum is one per vendor."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return ""


# Why a product's rows may differ by batch here: what tests comparing bits across row or thread counts skip with.
ROW_ORDER_VARIES = (
    "Intel: MKL's AVX2 branch (MKL_CBWR=AVX2) sums a row of a matrix product in an order that depends on the "
    "product's row count and thread count (',STRICT' would not, but changes what the default job learns: "
    "docs/architecture.md)"
)


def batch_invariant() -> bool:
    """Whether a row of a matrix product gets the same bits whatever the product's row and thread counts, under the
    pinned arithmetic: measured so on AMD processors, not on Intel's (ROW_ORDER_VARIES)."""
    return cpu_vendor() != "GenuineIntel"
