"""`rlboost` entry point (placeholder until the CLI lands)."""


def main() -> int:
    print("rlboost")
    return 0
