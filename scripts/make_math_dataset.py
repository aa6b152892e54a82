"""Write the example math dataset: simple arithmetic word problems with integer answers, chat-form prompts.

python scripts/make_math_dataset.py   # writes examples/data/math-train.jsonl and math-validation.jsonl

Each line: {"prompt": [{"role": "user", "content": ...}], "answer": "<integer>", "kind": "<template name>"}.
Generated from a fixed seed, so the files are reproducible (and free of any licence question); small numbers
keep the problems within reach of the tiny CPU model.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivo", "Jun"]
THINGS = ["apples", "books", "coins", "marbles", "pencils", "stickers", "shells", "cards"]

# name -> (template, answer from (a, b)); a >= b so that no answer is negative
TEMPLATES: dict[str, tuple[str, Callable[[int, int], int]]] = {
    "add": ("{n} has {a} {t}. {n} gets {b} more. How many {t} does {n} have now?", lambda a, b: a + b),
    "sub": ("{n} has {a} {t} and gives away {b}. How many {t} are left?", lambda a, b: a - b),
    "mul": ("{n} buys {a} bags with {b} {t} in each. How many {t} is that?", lambda a, b: a * b),
    "sum": ("One box holds {a} {t} and another holds {b}. How many {t} are there in all?", lambda a, b: a + b),
    "diff": ("{n} has {a} {t}, a friend has {b}. How many more {t} does {n} have?", lambda a, b: a - b),
}


def problem(rng: random.Random) -> dict:
    kind = rng.choice(sorted(TEMPLATES))
    text, answer = TEMPLATES[kind]
    a, b = sorted((rng.randint(1, 9), rng.randint(1, 9)), reverse=True)
    content = text.format(n=rng.choice(NAMES), t=rng.choice(THINGS), a=a, b=b)
    return {"prompt": [{"role": "user", "content": content}], "answer": str(answer(a, b)), "kind": kind}


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "examples" / "data", help="output directory")
    parser.add_argument("--train", type=int, default=400, help="training rows")
    parser.add_argument("--validation", type=int, default=100, help="validation rows")
    parser.add_argument("--seed", type=int, default=2026, help="generator seed")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    write(args.out / "math-train.jsonl", [problem(rng) for _ in range(args.train)])
    write(args.out / "math-validation.jsonl", [problem(rng) for _ in range(args.validation)])


if __name__ == "__main__":
    main()
