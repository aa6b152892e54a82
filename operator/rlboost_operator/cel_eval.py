"""The RLJob CRD's CEL rules evaluated offline with cel-python, as the API server evaluates them at `kubectl apply`:
each rule on the schema node that carries it (an object's properties, a list's items), after the schema's defaults
are applied; a transition rule (one that reads `oldSelf`) only on an update and only where the old object has that
node (list items have no old counterpart here: the CRD's lists are atomic). `rlboost validate` and the tests use it.

What it cannot show: the API server's CEL type checking and cost estimation when the CRD is registered.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any, NamedTuple


class Refusal(NamedTuple):
    """One rule that refused the object: where (the API server's field path) and its message; `error`: the rule
    could not be evaluated (a bug of the rule, not of the object)."""

    path: str
    message: str
    error: bool = False


def with_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting: each property of a present object that is left out gets its schema default."""
    if isinstance(obj, list) and "items" in schema:
        return [with_defaults(schema["items"], item) for item in obj]
    if not isinstance(obj, dict) or "properties" not in schema:
        return obj
    out = dict(obj)
    for key, sub in schema["properties"].items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = with_defaults(sub, out[key])
    return out


def _celpy() -> Any:
    """cel-python: the offline tools' extra, not the operator's (its image evaluates no rule)."""
    try:
        import celpy
    except ImportError:
        raise SystemExit("evaluating the CRD's CEL rules needs cel-python: pip install 'rlboost[tools]'") from None
    return celpy


@functools.cache
def _program(rule: str) -> Any:
    env = _celpy().Environment()
    return env.program(env.compile(rule))


def _holds(rule: str, here: Any, before: Any) -> bool | None:
    """The rule's verdict on `here` (and `before` for oldSelf); None when it does not evaluate to a bool."""
    celpy = _celpy()

    activation = {"self": celpy.json_to_cel(here)}
    if before is not None:
        activation["oldSelf"] = celpy.json_to_cel(before)
    try:
        result = _program(rule).evaluate(activation)
    except celpy.CELEvalError:
        return None
    return bool(result) if isinstance(result, celpy.celtypes.BoolType) else None


def _node_refusals(schema: dict[str, Any], here: Any, before: Any, path: str) -> Iterator[Refusal]:
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and before is None:
            continue
        verdict = _holds(rule["rule"], here, before if transition else None)
        if verdict is None:
            yield Refusal(path, f"rule {rule['rule']!r} did not evaluate to a bool", error=True)
        elif not verdict:
            yield Refusal(path + rule.get("fieldPath", ""), rule["message"])


def _walk(schema: dict[str, Any], here: Any, before: Any, path: str) -> Iterator[Refusal]:
    yield from _node_refusals(schema, here, before, path)
    if isinstance(here, dict):
        old = before if isinstance(before, dict) else {}
        for key, sub in (schema.get("properties") or {}).items():
            if key in here and here[key] is not None:
                yield from _walk(sub, here[key], old.get(key), f"{path}.{key}")
    elif isinstance(here, list) and "items" in schema:
        for i, item in enumerate(here):
            yield from _walk(schema["items"], item, None, f"{path}[{i}]")


def refusals(
    schema: dict[str, Any],
    new: dict[str, Any],
    old: dict[str, Any] | None = None,
    path: str = "spec",
    defaulted: bool = True,
) -> list[Refusal]:
    """The rules of `schema` (RLJob.spec's) that refuse `new`: a create when `old` is None, else an update of
    `old`. Both are defaulted first, as the API server does (`defaulted` False: as written, for tests)."""
    if defaulted:
        new, old = with_defaults(schema, new), (with_defaults(schema, old) if old is not None else None)
    return list(_walk(schema, new, old, path))
