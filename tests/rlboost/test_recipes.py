"""examples/recipes/: DAPO, Dr. GRPO and GSPO as local configs — each parses into the options it names, and its header
gives the same recipe in TRL's and veRL's names (docs/algorithms.md has the whole table). One of them runs:
tests/e2e/test_recipes_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlboost.spec import load_job_spec

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"
EXPECTED = {
    "dapo.yaml": {
        "loss_aggregation": "token-mean",
        "advantage_normalization": "group",
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "kl_coef": 0.0,
    },
    "dr-grpo.yaml": {"loss_aggregation": "token", "advantage_normalization": "none", "kl_coef": 0.0},
    "gspo.yaml": {
        "importance_ratio": "sequence",
        "loss_aggregation": "sequence",
        "clip_ratio_low": 0.0003,
        "clip_ratio_high": 0.0004,
        "updates_per_step": 2,
    },
}


def test_every_recipe_is_listed():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_recipe_parses_into_the_options_it_names(name):
    path = RECIPES / name
    alg = load_job_spec(path).algorithm
    assert {k: getattr(alg, k) for k in EXPECTED[name]} == EXPECTED[name]
    header = path.read_text().split("\nalgorithm:")[0]
    assert "rlboost local --config examples/recipes/" + name in header
    assert "# TRL:" in header and "# veRL:" in header
