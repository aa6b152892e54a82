"""Constraints for installing an extra onto a base image that already holds some of the lock's packages.

GPU images start from a vendor image (SGLang, PyTorch CUDA) whose torch, CUDA libraries and engine are built
together; reinstalling them at the lock's versions would break that. This prints requirements/lock.txt's pins
with each package the running environment already has pinned at its installed version instead, so
`pip install -c <this output> '.[extra]'` adds only what the base lacks, at the lock's versions.

    python3 scripts/lock_over_base.py requirements/lock.txt > /tmp/constraints.txt

Standard library only (it runs in the base image's Python before anything is installed).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock_path: str) -> int:
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    for line in Path(lock_path).read_text(encoding="utf-8").splitlines():
        pin = line.split("#", 1)[0].strip()
        if "==" not in pin:
            continue
        name = canonical(pin.split("==", 1)[0].split("[", 1)[0])
        print(f"{name}=={installed[name]}" if name in installed else pin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "requirements/lock.txt"))
