"""Tests of rlboost.models: the trained tokenizer and chat template, the tiny model's directory
(loads with transformers, generates, float32 safetensors), ensure_model's idempotence, determinism
and errors, and the default model's format/accuracy after warm-up."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlboost.models import (
    END_OF_TEXT,
    IM_END,
    ModelError,
    decode_response,
    encode_prompt,
    ensure_model,
    load_tokenizer,
    stop_token_ids,
)
from rlboost.sampling import sample_next
from rlboost.spec import ModelSpec, TaskSpec
from rlboost.tasks import Example, make_task
from rlboost.tasks.rewards import exact_match, format_reward
from rlboost.weights.checksum import state_checksum

SMALL = ModelSpec(hidden_size=32, num_layers=1, num_heads=2, warmup_steps=3, seed=0)
SMALL_TASK = TaskSpec(num_prompts=40)
ANY = Example("", "")  # format_reward ignores the example


@pytest.fixture(scope="module")
def formatted_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model with enough warm-up to have learnt the answer format (about a second)."""
    spec = ModelSpec(hidden_size=64, num_layers=1, num_heads=2, warmup_steps=40)
    return ensure_model(spec, TaskSpec(), tmp_path_factory.mktemp("formatted") / "model")


def _checksum(path: Path) -> str:
    state: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(f))
    return state_checksum(state)


def test_tokenizer_round_trip_and_specials(formatted_model: Path) -> None:
    tok = load_tokenizer(formatted_model)
    text = "What is 12+345? The answer: 357 ünïcode"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert 200 <= len(tok) <= 600  # a few hundred tokens
    assert tok.eos_token == IM_END and tok.pad_token == END_OF_TEXT
    stops = stop_token_ids(tok)
    assert stops == [tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(END_OF_TEXT)]
    assert decode_response(tok, tok.encode("7", add_special_tokens=False) + stops[:1]) == "7"
    assert tok.encode("<|im_end|>", add_special_tokens=False) == stops[:1]  # one special token, not bytes


def test_chat_template_is_qwen_style(formatted_model: Path) -> None:
    tok = load_tokenizer(formatted_model)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    ids = encode_prompt(tok, messages)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text


def test_model_loads_with_transformers_and_generates(formatted_model: Path) -> None:
    assert (formatted_model / "config.json").is_file() and list(formatted_model.glob("*.safetensors"))
    assert all(t.dtype == torch.float32 for t in load_file(next(formatted_model.glob("*.safetensors"))).values())
    tok = AutoTokenizer.from_pretrained(formatted_model)
    model = AutoModelForCausalLM.from_pretrained(formatted_model).eval()
    assert model.config.model_type == "qwen3" and model.config.num_key_value_heads == 2
    prompt = encode_prompt(tok, [{"role": "user", "content": "What is 2+3?"}])
    out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    response = out[0, len(prompt) :].tolist()
    assert response[-1] in stop_token_ids(tok)  # the warm-up taught it to end its turn
    assert format_reward(decode_response(tok, response), ANY) == 1.0


def _sample_responses(path: Path, task_spec: TaskSpec, n_prompts: int, n_samples: int) -> list[tuple[str, str]]:
    """Temperature-1 sampling with rlboost.sampling (no KV cache: responses are a few tokens)."""
    tok, model = load_tokenizer(path), AutoModelForCausalLM.from_pretrained(path).eval()
    task = make_task(task_spec)
    examples = [ex for _, ex in task.batch(0, n_prompts) for _ in range(n_samples)]
    rows = [encode_prompt(tok, task.messages(ex)) for ex in examples]
    assert len({len(r) for r in rows}) == 1  # single-digit operands: equal lengths, no padding needed
    ids, stops = torch.tensor(rows), set(stop_token_ids(tok))
    out: list[list[int]] = [[] for _ in rows]
    with torch.no_grad():
        for pos in range(6):
            logits = model(input_ids=ids).logits[:, -1]
            n = len(rows)
            tokens, _ = sample_next(logits, torch.ones(n), torch.arange(n), torch.full((n,), pos))
            for i, t in enumerate(tokens.tolist()):
                if not out[i] or out[i][-1] not in stops:
                    out[i].append(t)
            ids = torch.cat([ids, tokens[:, None]], dim=1)
    return [(decode_response(tok, o), ex.answer) for o, ex in zip(out, examples, strict=True)]


@pytest.mark.slow
def test_default_model_has_the_format_and_modest_accuracy(tmp_path: Path) -> None:
    """The default job's model after warm-up: the format is right almost always, the answer only
    sometimes (room for RL). Slow: the default warm-up takes ~10 s alone, longer on a busy machine."""
    path = ensure_model(ModelSpec(), TaskSpec(), tmp_path / "model")
    results = _sample_responses(path, TaskSpec(), n_prompts=40, n_samples=4)
    fmt = sum(format_reward(text, ANY) for text, _ in results) / len(results)
    acc = sum(exact_match(text, Example("", answer)) for text, answer in results) / len(results)
    assert fmt >= 0.9, fmt
    assert 0.05 <= acc <= 0.7, acc


def test_ensure_model_is_idempotent(tmp_path: Path) -> None:
    path = ensure_model(SMALL, SMALL_TASK, tmp_path / "m")
    files = {f.name: f.stat().st_mtime_ns for f in path.iterdir()}
    assert ensure_model(SMALL.model_copy(update={"seed": 9}), SMALL_TASK, path) == path  # reused, not recreated
    assert {f.name: f.stat().st_mtime_ns for f in path.iterdir()} == files
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary directory left behind


def test_ensure_model_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBOOST_CACHE_DIR", "off")  # every model below is really created
    a = _checksum(ensure_model(SMALL, SMALL_TASK, tmp_path / "a"))
    b = _checksum(ensure_model(SMALL, SMALL_TASK, tmp_path / "b"))
    c = _checksum(ensure_model(SMALL.model_copy(update={"seed": 1}), SMALL_TASK, tmp_path / "c"))
    assert a == b
    assert a != c


def test_a_created_model_is_cached_and_the_next_run_copies_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBOOST_CACHE_DIR", str(tmp_path / "cache"))
    a = ensure_model(SMALL, SMALL_TASK, tmp_path / "a")
    [entry] = (tmp_path / "cache" / "models").iterdir()

    def not_again(*_: object) -> None:
        raise AssertionError("created again")

    monkeypatch.setattr("rlboost.models.tiny_cache.create_tiny_model", not_again)
    b = ensure_model(SMALL.model_copy(update={"path": "elsewhere"}), SMALL_TASK, tmp_path / "b")
    assert _checksum(a) == _checksum(b) == _checksum(entry)
    assert sorted(f.name for f in a.iterdir()) == sorted(f.name for f in b.iterdir())
    with pytest.raises(AssertionError, match="created again"):  # another seed is another key
        ensure_model(SMALL.model_copy(update={"seed": 1}), SMALL_TASK, tmp_path / "c")
    with pytest.raises(AssertionError, match="created again"):  # so is another task
        ensure_model(SMALL, SMALL_TASK.model_copy(update={"max_operand": 6}), tmp_path / "d")
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [entry.name]  # nothing half-written


def test_cache_off_or_unusable_still_creates_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBOOST_CACHE_DIR", "off")
    assert (ensure_model(SMALL, SMALL_TASK, tmp_path / "a") / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("RLBOOST_CACHE_DIR", str(tmp_path / "not-a-dir"))
    assert (ensure_model(SMALL, SMALL_TASK, tmp_path / "b") / "config.json").is_file()


def test_ensure_model_accepts_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert (ensure_model(SMALL, SMALL_TASK, tmp_path / "m") / "config.json").is_file()


def test_missing_path_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model.path") as err:
        ensure_model(ModelSpec(source="path", path=str(tmp_path / "x")), SMALL_TASK, tmp_path / "x")
    assert "config.json" in str(err.value)


def test_non_model_directory_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match="not a model directory"):
        ensure_model(SMALL, SMALL_TASK, tmp_path / "m")
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_bad_head_count_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model.numHeads"):
        ensure_model(SMALL.model_copy(update={"num_heads": 3}), SMALL_TASK, tmp_path / "m")
    assert not (tmp_path / "m").exists()
