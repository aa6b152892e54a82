"""Delta codec benchmark on synthetic RL-like updates (the code lives in rlboost.delta.bench).

python bench/delta_bench.py [--json] [--elements N] [--lr 1e-6] [--repeat 3]
rlboost delta bench [...]                     (same thing)
"""

from __future__ import annotations

import argparse
import sys

from rlboost.delta.bench import add_arguments, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="rlboost delta codec benchmark (synthetic RL-like bf16 updates)")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
