"""rlboost.cpu_numerics.cpu_vendor: which processor vendor's pinned checksum applies (tests/e2e/test_learning_e2e.py)."""

from __future__ import annotations

from pathlib import Path

from rlboost.cpu_numerics import cpu_vendor


def test_the_vendor_is_the_kernels_vendor_id_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\nprocessor\t: 1\n")
    assert cpu_vendor(cpuinfo) == "AuthenticAMD"


def test_no_vendor_line_or_no_file_is_unknown(tmp_path: Path) -> None:
    arm = tmp_path / "cpuinfo"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")
    assert cpu_vendor(arm) == "" and cpu_vendor(tmp_path / "absent") == ""
