"""What a Hugging Face model directory holds, as rlboost uses it: weights, and the assets beside them.

Torch-free and import-cheap (the fetcher, the trainer's asset upload and checks use it):

    missing = model_dir_problem(path)        # '' when path holds config.json, a tokenizer and safetensors
    assets = asset_files(path)               # config.json, tokenizer files, chat template... (no weights)

The weights (*.safetensors, with their shard index) travel as weight versions through the weight-server;
the assets are served beside them (GET /v1/assets), so a spot worker builds its engine from the assets
and the first version it pulls, without reaching the model store.
"""

from __future__ import annotations

import fnmatch
import json
import struct
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
# Everything else a causal LM's serving and training read from its directory (transformers' names).
ASSET_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
MODEL_PATTERNS = (*WEIGHT_PATTERNS, *ASSET_PATTERNS)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
SAFETENSORS_HEADER_MAX = 100 << 20  # the format's own bound on the JSON header


def wanted(name: str, patterns: tuple[str, ...] = MODEL_PATTERNS) -> bool:
    """Whether a file name (no directory) is one of the model's files."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def asset_files(model_dir: str | Path) -> list[Path]:
    """The model directory's non-weight files that serving needs, sorted by name."""
    root = Path(model_dir)
    return sorted(p for p in root.iterdir() if p.is_file() and wanted(p.name, ASSET_PATTERNS))


def is_model_dir(path: Path) -> bool:
    """True when `path` holds a saved model: config.json and at least one *.safetensors file (the quick check;
    `model_dir_problem` is the thorough one)."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def model_dir_problem(model_dir: str | Path) -> str:
    """'' when `model_dir` holds a usable HF model (config.json with a model_type, a tokenizer, readable
    safetensors and every shard its index names); else what is wrong, in a few words."""
    root = Path(model_dir)
    if not root.is_dir():
        return f"{root} is not a directory"
    problem = config_problem(root) or tokenizer_problem(root)
    if problem:
        return problem
    shards = sorted(root.glob("*.safetensors"))
    if not shards:
        return f"{root} holds no *.safetensors weights"
    for shard in shards:
        problem = safetensors_problem(shard)
        if problem:
            return problem
    return _index_problem(root)


def config_problem(root: Path) -> str:
    try:
        config = json.loads((root / "config.json").read_text())
    except FileNotFoundError:
        return f"{root} holds no config.json"
    except (OSError, ValueError) as err:
        return f"{root}/config.json is not readable JSON ({err})"
    if not isinstance(config, dict) or "model_type" not in config:
        return f"{root}/config.json has no model_type: not a transformers model config"
    return ""


def tokenizer_problem(root: Path) -> str:
    if any((root / name).is_file() for name in TOKENIZER_FILES):
        return ""
    return f"{root} holds no tokenizer ({', '.join(TOKENIZER_FILES)})"


def safetensors_problem(path: Path) -> str:
    """'' when the file starts with a well-formed safetensors header that fits in the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(SAFETENSORS_HEADER_MAX, size - 8):
                return f"{path.name} is not a safetensors file (header length {length} of a {size}-byte file)"
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as err:
        return f"{path.name} is not a readable safetensors file ({type(err).__name__}: {err})"
    if not isinstance(header, dict):
        return f"{path.name} is not a safetensors file (its header is not a JSON object)"
    return ""


def _index_problem(root: Path) -> str:
    for index in root.glob("*.safetensors.index.json"):
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            return f"{index.name} is not a readable shard index ({type(err).__name__})"
        missing = sorted({str(shard) for shard in weight_map.values()} - {p.name for p in root.glob("*.safetensors")})
        if missing:
            return f"{index.name} names shards that are missing: {', '.join(missing[:3])}"
    return ""
