"""Typed readers for untyped YAML data: each returns a checked value or raises `SpecError` naming the field
path, the bad value and what is allowed. `spec.py` composes them; nothing here knows the fleet schema."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, NoReturn

from fleet.errors import SpecError

_VAR = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Fields:
    """Reads the keys of one YAML mapping, then rejects whatever key was not read (`done()`)."""

    def __init__(self, data: object, path: str, source: str) -> None:
        self.path = path
        self.source = source
        if not isinstance(data, Mapping):
            self.fail(path or "(top level)", data, "expected a mapping (key: value)")
        self.data: Mapping[str, Any] = data
        self._seen: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, field: str, value: object, allowed: str) -> NoReturn:
        raise SpecError(field, value, allowed, source=self.source)

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self._seen.add(key)
        return self.data.get(key, default)

    def done(self, allowed: list[str]) -> None:
        for key in self.data:
            if key not in allowed:
                self.fail(self.sub(str(key)), key, f"unknown key; allowed keys: {', '.join(allowed)}")


# Jinja2's three openers. Ansible templates every inventory and extra-vars string it reads, so a spec value
# holding one would run as code on the controller (`{{ lookup('pipe', ...) }}`). Spec values are data.
TEMPLATE_MARKERS = ("{{", "{%", "{#")


def refuse_templates(source: str, field: str, value: object) -> None:
    """Walk a raw spec (before any parsing) and refuse a Jinja2 opener in any key or string value."""
    if isinstance(value, str):
        if any(m in value for m in TEMPLATE_MARKERS):
            fail(source, field or "(top)", value, "spec values are data: `{{`, `{%` and `{#` are not allowed")
    elif isinstance(value, dict):
        for key, item in value.items():
            sub = f"{field}.{key}" if field else str(key)
            refuse_templates(source, sub, key)
            refuse_templates(source, sub, item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            refuse_templates(source, f"{field}[{i}]", item)


def fail(source: str, field: str, value: object, allowed: str) -> NoReturn:
    raise SpecError(field, value, allowed, source=source)


def string(source: str, field: str, value: object, *, pattern: str | None = None, what: str = "") -> str:
    if not isinstance(value, str):
        fail(source, field, value, f"expected a quoted string{': ' + what if what else ''}")
    if pattern is not None and not re.fullmatch(pattern, value):
        fail(source, field, value, f"expected {what or 'a string matching ' + pattern}")
    return value


def integer(source: str, field: str, value: object, *, lo: int, hi: int) -> int:
    # bool is an int subclass in Python: `port: yes` must not become port 1
    if isinstance(value, bool) or not isinstance(value, int):
        fail(source, field, value, f"expected an integer {lo}..{hi}")
    if not lo <= value <= hi:
        fail(source, field, value, f"expected an integer {lo}..{hi}")
    return value


def number(source: str, field: str, value: object, *, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(source, field, value, f"expected a number {lo}..{hi}")
    if not lo <= float(value) <= hi:
        fail(source, field, value, f"expected a number {lo}..{hi}")
    return float(value)


def boolean(source: str, field: str, value: object) -> bool:
    if not isinstance(value, bool):
        fail(source, field, value, "expected true or false")
    return value


def choice(source: str, field: str, value: object, allowed: list[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        fail(source, field, value, f"expected one of: {', '.join(allowed)}")
    return value


def string_list(source: str, field: str, value: object, *, pattern: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        fail(source, field, value, f"expected a list of {what}")
    out = [string(source, f"{field}[{i}]", item, pattern=pattern, what=what) for i, item in enumerate(value)]
    return tuple(out)


def percent_or_int(source: str, field: str, value: object, *, lo: int, what: str) -> int | str:
    """`3` (a count >= lo) or `"25%"` (1..100 percent, 0 allowed when lo is 0)."""
    if isinstance(value, str):
        m = re.fullmatch(r"([0-9]{1,3})%", value)
        if m and max(lo, 0) <= int(m.group(1)) <= 100 and (lo == 0 or int(m.group(1)) >= 1):
            return value
        fail(source, field, value, f'expected {what}: an integer >= {lo} or a percentage like "25%" (0-100)')
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        fail(source, field, value, f'expected {what}: an integer >= {lo} or a percentage like "25%"')
    return value


def expand(source: str, field: str, value: str, variables: Mapping[str, str]) -> str:
    """Expand `${NAME}` from `variables` (the environment plus SOLFLEET_WORK); an unset name is an error
    rather than an empty string, so a typo never turns `/srv/${ROOT}/x` into `/srv//x`."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if not _VAR_NAME.fullmatch(name):
            fail(source, field, value, f"${{{name}}} is not a variable name (letters, digits, _)")
        if name not in variables:
            fail(source, field, value, f"environment variable {name} is not set (SOLFLEET_WORK always is)")
        return variables[name]

    if "$" in _VAR.sub("", value):
        fail(source, field, value, "a `$` must start `${NAME}`")
    return _VAR.sub(one, value)


def node_path(source: str, field: str, value: object, variables: Mapping[str, str]) -> PurePosixPath:
    """An absolute path on a node: after `${VAR}` expansion it must be absolute, contain no `..`, and not be
    `/` itself (a deploy prunes directories under it)."""
    text = expand(source, field, string(source, field, value, what="an absolute path"), variables)
    allowed = "expected an absolute path without `..` components, not `/`"
    if not text.startswith("/") or any(c in text for c in "\n\r\0"):
        fail(source, field, text, allowed)
    path = PurePosixPath(text)
    if ".." in path.parts or path == PurePosixPath("/"):
        fail(source, field, text, allowed)
    return path


def controller_path(
    source: str, field: str, value: object, variables: Mapping[str, str], *, base: str
) -> str:
    """A path on the controller (ssh key, known_hosts): `${VAR}` and `~` are expanded, a relative path is
    taken relative to the spec file's directory (`base`)."""
    text = expand(source, field, string(source, field, value, what="a file path"), variables)
    if any(c in text for c in '\0\n\r"'):
        # `"` too: the path is handed to ssh inside double quotes (fleet/inventory.py)
        fail(source, field, text, 'expected a file path (no newline, NUL or `"`)')
    text = os.path.expanduser(text)
    if not os.path.isabs(text):
        text = os.path.join(base, text)
    return os.path.normpath(text)
