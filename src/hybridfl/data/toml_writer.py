"""Writing TOML values and keys (the federation schema file, :mod:`hybridfl.data.federation`):
strings escaped as TOML basic strings, floats with ``nan``/``inf``, lists and inline tables;
``tomllib`` reads the text back equal."""

from __future__ import annotations

import math
import re
from typing import Any

from hybridfl.errors import ConfigError

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(k: str) -> str:
    """``k`` as a TOML key: bare when it can be, else a quoted string."""
    return k if _BARE.fullmatch(k) else _str(k)


def _str(s: str) -> str:
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    """``v`` (bool, int, float, str, list, mapping) as a TOML value.

    Raises:
        ConfigError: a value of another type.
    """
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(str(k))} = {toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise ConfigError(f"a value of type {type(v).__name__} cannot be written to the federation schema.")
