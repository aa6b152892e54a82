"""The reward sandbox process: loads one registered reward, then scores batches read from stdin, confined.

Run by rlboost.tasks.sandbox (`python -m rlboost.tasks.sandbox_child '<config json>'`), never by hand.
Before the reward's module is imported: the parent's death kills this process (PR_SET_PDEATHSIG), a network
namespace of its own is tried (unshare(CLONE_NEWNET), then inside a user namespace; where neither is permitted
the audit hook alone refuses sockets), and the address space is capped (RLIMIT_AS). After the import an audit
hook refuses sockets, processes (subprocess, os.exec*, os.system, os.posix_spawn, os.spawn*, os.fork) and
compiling or executing code that is not a module file (exec/eval/compile of text: what `cProfile.run` did with
model output), with one narrow exception: the number literals SymPy's `parse_expr` generates and evaluates for
math-verify (`Integer (12 )`, `Float ('0.5' )`, `from sympy import *`; see `_safe_sympy_text`).
A reward that catches the refusal still scores 0: any refused event fails the call.
Each call gets a CPU budget (RLIMIT_CPU soft limit; SIGXCPU ends the process); the parent enforces wall time.

The config names the reward's terms `[[entry point, weight, params], ...]` (rlboost.reward_registry.reward_terms):
a sample's reward is sum(weight x fn(text, example, **params)); any term failing fails the sample.

Protocol (JSON lines): the request `{"items": [[text, {"question": q, "answer": a, "metadata": m}], ...]}` on
stdin, one reply
per item on the protocol fd (the original stdout; what the reward prints goes to stderr):
`{"r": value}` or `{"fail": reason, "detail": text}`. The first line written is `{"ready": true, "netns": bool}`
or `{"fail": "load", "detail": text}`.
"""

from __future__ import annotations

import ast
import ctypes
import inspect
import json
import math
import os
import re
import resource
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
# Audit events refused once the reward is loaded (prefixes end with '.', the rest are exact names).
_REFUSED_PREFIXES = ("socket.",)
_REFUSED_EVENTS = frozenset(
    {"subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork", "os.forkpty", "pty.spawn"}
)
# What SymPy's parse_expr compiles for number literals: these names, numbers, quoted number/symbol text,
# arithmetic and calls. Every name must be one of _SYMPY_NAMES, so no attribute (`.__class__`) or builtin is
# reachable; `from sympy import *` is what parse_expr runs first into its namespace.
_SYMPY_NAMES = frozenset({"Integer", "Float", "Rational", "Symbol", "Add", "Mul", "Pow"})
_SYMPY_KEYWORDS = frozenset({"evaluate", "False", "True"})  # parse_expr(evaluate=False): Add(..., evaluate=False)
_SYMPY_TOKEN = re.compile(r"\s+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|'[A-Za-z0-9_.+\-]*'|([A-Za-z_]\w*)|[-+*/(),.=]")
_SYMPY_IMPORT = "from sympy import *"
_MAX_SYMPY_TEXT = 256


class SandboxViolationError(RuntimeError):
    """An audit event the sandbox refuses (network, a process, executing text)."""


_violations: list[str] = []


def _file_backed(filename: object) -> bool:
    """Code compiled from a module file (an import), as opposed to text ('<string>', '<stdin>', ...)."""
    return isinstance(filename, str) and filename.endswith(".py") and Path(filename).is_file()


def _safe_sympy_text(source: object) -> bool:
    """Text SymPy's parse_expr generates for a number literal (see _SYMPY_TOKEN), and nothing else."""
    if isinstance(source, ast.AST):  # parse_expr(evaluate=False) compiles a rewritten tree: judge its text
        try:
            source = ast.unparse(source)
        except (ValueError, TypeError, AttributeError, RecursionError):
            return False
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    if not isinstance(source, str) or len(source) > _MAX_SYMPY_TEXT:
        return False
    if source == _SYMPY_IMPORT:
        return True
    pos, names = 0, 0
    while pos < len(source):
        token = _SYMPY_TOKEN.match(source, pos)
        name = token.group(1) if token is not None else None
        if token is None or (name is not None and name not in _SYMPY_NAMES | _SYMPY_KEYWORDS):
            return False
        names += name in _SYMPY_NAMES
        pos = token.end()
    return names > 0  # SymPy wraps every literal in a constructor; bare arithmetic text is something else


def _safe_sympy_code(code: Any) -> bool:
    """A code object compiled from _safe_sympy_text: only those names, no nested code."""
    names = set(getattr(code, "co_names", ("?",)))
    consts = getattr(code, "co_consts", ())
    allowed = (names and names <= _SYMPY_NAMES) or names == {"sympy"}
    return bool(allowed) and not any(hasattr(c, "co_code") for c in consts)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "compile":
        refused = not (len(args) > 1 and (_file_backed(args[1]) or _safe_sympy_text(args[0])))
    elif event == "exec":
        code = args[0] if args else None
        refused = not (hasattr(code, "co_filename") and (_file_backed(code.co_filename) or _safe_sympy_code(code)))
    else:
        refused = event in _REFUSED_EVENTS or event.startswith(_REFUSED_PREFIXES)
    if refused:
        _violations.append(event)
        raise SandboxViolationError(f"the reward sandbox refuses {event!r}")


def _own_network_namespace(libc: ctypes.CDLL) -> bool:
    """No network at all: a fresh network namespace (only a down loopback). False where not permitted."""
    if libc.unshare(_CLONE_NEWNET) == 0:
        return True
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return False
    try:  # keep our own uid/gid inside the user namespace, so file permissions read as before
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError:
        pass  # unmapped ids: files read as 'other'; the network is gone either way
    return True


def _confine_process(memory_mib: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends us (Ctrl-C reaches the whole group)
    netns = _own_network_namespace(libc)
    limit = memory_mib << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return netns


def _cpu_budget(seconds: int) -> None:
    """Allow `seconds` more CPU from now (soft RLIMIT_CPU; the kernel sends SIGXCPU past it)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    now = math.ceil(used.ru_utime + used.ru_stime)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = now + seconds if hard == resource.RLIM_INFINITY else min(hard, now + seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


Term = tuple[Any, float, dict[str, Any]]  # a loaded reward function, its weight, its keyword parameters


def _score(terms: list[Term], text: str, example: Any, cpu_seconds: int) -> dict[str, Any]:
    """The weighted sum of the terms' values, or the first failure (which fails the whole sample)."""
    _cpu_budget(cpu_seconds)
    total = 0.0
    for fn, weight, params in terms:
        try:
            value = fn(text, example, **params) if params else fn(text, example)
        except MemoryError:
            return {"fail": "memory", "detail": "MemoryError (rewardMemoryMib)"}
        except BaseException as err:  # noqa: BLE001 - any failure of the reward is that sample's 0
            if _violations:
                return {"fail": "refused", "detail": _violations[-1]}
            return {"fail": "exception", "detail": f"{type(err).__name__}: {err}"[:500]}
        if _violations:  # the reward caught the refusal and returned anyway
            return {"fail": "refused", "detail": _violations[-1]}
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return {"fail": "bad_value", "detail": f"returned {type(value).__name__} {str(value)[:80]}"}
        total += weight * float(value)
    return {"r": total}


def _load_term(name: str, weight: float, params: dict[str, Any]) -> Term:
    """Import the reward `name`; its parameters must fit its signature (a mistake fails the start, not each call)."""
    from rlboost.reward_registry import load_registered

    fn = load_registered(name)
    try:
        inspect.signature(fn).bind("response", None, **params)
    except TypeError as err:
        signature = inspect.signature(fn)
        raise TypeError(f"task.reward {name!r}: params {sorted(params)} do not fit {name}{signature}: {err}") from None
    except ValueError:
        pass  # no signature to check (a builtin): calls will tell
    if callable(check := getattr(fn, "check_params", None)):
        check(**params)  # the reward's own check of its parameters (a bad regex): a clear error at start
    if callable(warm_up := getattr(fn, "warm_up", None)):
        warm_up()  # before the audit hook: a library's code generated on first use (SymPy, mpmath) is no model output
    return fn, float(weight), dict(params)


def main() -> None:
    config = json.loads(sys.argv[1])
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the reward prints goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    netns = _confine_process(config["memory_mib"])
    try:
        from rlboost.tasks.base import Example

        terms = [_load_term(name, weight, params) for name, weight, params in config["terms"]]
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which fails the job clearly
        proto.write(json.dumps({"fail": "load", "detail": "".join(traceback.format_exception_only(err)).strip()}))
        proto.write("\n")
        proto.flush()
        sys.exit(1)
    sys.addaudithook(_audit)
    proto.write(json.dumps({"ready": True, "netns": netns}) + "\n")
    for line in sys.stdin:
        for text, ex in json.loads(line)["items"]:
            reply = _score(terms, text, Example(**ex), config["cpu_seconds"])
            proto.write(json.dumps(reply) + "\n")  # line-buffered: each reply goes out at once, so a hang or a
            # crash is blamed on the sample that caused it, never on earlier ones still in a buffer
            if "fail" in reply:
                os._exit(3)  # a failed call may have left the process in any state: the parent starts a new one


if __name__ == "__main__":
    main()
