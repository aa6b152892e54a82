"""Read a YAML file a person wrote (a job spec, a local config), or fail with one line that names the file, the
place in it and the fix.

PyYAML alone turns some bad files into tracebacks: bytes that are not UTF-8 (UnicodeDecodeError), nesting a few
thousand levels deep (RecursionError in its composer), an integer of more than 4,300 digits (Python's int-parsing
limit), a directory or an unreadable path (OSError). Its own syntax errors span several lines. Here each becomes
one `ConfigFileError` line; the file's size, its nesting and what its aliases expand to are bounded before
anything validates it.

    data = load_yaml_file(Path("job.yaml"))   # a dict, list or scalar, or ConfigFileError
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 4 << 20  # a job spec is a few KB; datasets and models live elsewhere
MAX_DEPTH = 64  # the deepest a job spec goes is ~6 levels
MAX_VALUES = 100_000  # values after YAML aliases are expanded (a "billion laughs" file stops here)


class ConfigFileError(ValueError):
    """A file that cannot be read as YAML; the message is one line naming the file."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting and integers Python will not parse, naming the line."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ConfigFileError(f"line {mark.line + 1}: nested more than {MAX_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node: Any) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise ConfigFileError(
                f"line {node.start_mark.line + 1}: an integer of {len(node.value)} characters; "
                "write a number of at most 4300 digits"
            ) from None


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_yaml_file(path: Path, what: str = "config file") -> Any:
    """The YAML document in `path`, or ConfigFileError('<what> <path>: <why>; <fix>')."""
    text = _read_text(path, what)
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except ConfigFileError as err:
        raise ConfigFileError(f"{what} {path}: {err}") from None
    except yaml.MarkedYAMLError as err:
        raise ConfigFileError(f"{what} {path} is not valid YAML: {_one_line(err)}") from None
    except yaml.YAMLError as err:
        raise ConfigFileError(f"{what} {path} is not valid YAML: {' '.join(str(err).split())}") from None
    if _expanded_size(data, MAX_VALUES) > MAX_VALUES:
        raise ConfigFileError(
            f"{what} {path}: expands to more than {MAX_VALUES:,} values (YAML aliases?); write it out plainly"
        )
    return data


def _read_text(path: Path, what: str) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigFileError(f"{what} {path} is {size:,} bytes; a job spec is at most {MAX_FILE_BYTES:,}")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigFileError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigFileError(f"{what} {path} is a directory; pass the YAML file in it") from None
    except OSError as err:
        raise ConfigFileError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigFileError(
            f"{what} {path}: byte {err.start} (line {line}) is not UTF-8; save the file as UTF-8"
        ) from None


def _one_line(err: yaml.MarkedYAMLError) -> str:
    mark = err.problem_mark or err.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return where + " ".join(f"{err.context or ''} {err.problem or ''}".split())


def _expanded_size(data: Any, limit: int) -> int:
    """Values in `data` counting each alias's copy again; stops counting past `limit`."""
    count, stack = 0, [data]
    while stack and count <= limit:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count
