"""The reward sandbox process: loads one registered reward, then scores batches read from stdin, confined.

Run by rlboost.tasks.sandbox (`python -m rlboost.tasks.sandbox_child '<config json>'`), never by hand.
Before the reward's module is imported: the parent's death kills this process (PR_SET_PDEATHSIG), a network
namespace of its own is tried (unshare(CLONE_NEWNET), then inside a user namespace; where neither is permitted
the audit hook alone refuses sockets), and the address space is capped (RLIMIT_AS). After the import an audit
hook refuses sockets, processes (subprocess, os.exec*, os.system, os.posix_spawn, os.spawn*, os.fork) and
compiling or executing code that is not a module file (exec/eval/compile of text: what `cProfile.run` did with
model output). A reward that catches the refusal still scores 0: any refused event fails the call.
Each call gets a CPU budget (RLIMIT_CPU soft limit; SIGXCPU ends the process); the parent enforces wall time.

Protocol (JSON lines): the request `{"items": [[text, {"question": q, "answer": a}], ...]}` on stdin, one reply
per item on the protocol fd (the original stdout; what the reward prints goes to stderr):
`{"r": value}` or `{"fail": reason, "detail": text}`. The first line written is `{"ready": true, "netns": bool}`
or `{"fail": "load", "detail": text}`.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
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


class SandboxViolationError(RuntimeError):
    """An audit event the sandbox refuses (network, a process, executing text)."""


_violations: list[str] = []


def _file_backed(filename: object) -> bool:
    """Code compiled from a module file (an import), as opposed to text ('<string>', '<stdin>', ...)."""
    return isinstance(filename, str) and filename.endswith(".py") and Path(filename).is_file()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "compile":
        refused = not _file_backed(args[1]) if len(args) > 1 else True
    elif event == "exec":
        refused = not (args and hasattr(args[0], "co_filename") and _file_backed(args[0].co_filename))
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


def _score(fn: Any, text: str, example: Any, cpu_seconds: int) -> dict[str, Any]:
    _cpu_budget(cpu_seconds)
    try:
        value = fn(text, example)
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
    return {"r": float(value)}


def main() -> None:
    config = json.loads(sys.argv[1])
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the reward prints goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    netns = _confine_process(config["memory_mib"])
    try:
        from rlboost.reward_registry import load_registered
        from rlboost.tasks.base import Example

        fn = load_registered(config["reward"])
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which fails the job clearly
        proto.write(json.dumps({"fail": "load", "detail": "".join(traceback.format_exception_only(err)).strip()}))
        proto.write("\n")
        proto.flush()
        sys.exit(1)
    sys.addaudithook(_audit)
    proto.write(json.dumps({"ready": True, "netns": netns}) + "\n")
    for line in sys.stdin:
        for text, ex in json.loads(line)["items"]:
            reply = _score(fn, text, Example(**ex), config["cpu_seconds"])
            proto.write(json.dumps(reply) + "\n")  # line-buffered: each reply goes out at once, so a hang or a
            # crash is blamed on the sample that caused it, never on earlier ones still in a buffer
            if "fail" in reply:
                os._exit(3)  # a failed call may have left the process in any state: the parent starts a new one


if __name__ == "__main__":
    main()
