"""Safe JSON for untrusted callbacks: what json.loads lets through that would crash or poison the code after it.

json.loads recurses once per nesting level until a RecursionError, accepts NaN and Infinity (and reads 1e400 as
inf, which the queue's JSON writes as null), and decodes a lone surrogate escape ("\\ud800") into a str that no
UTF-8 encoder (Redis, the queue) accepts. Platform payloads are a few levels deep, finite and valid Unicode:
anything else becomes a CallbackRejected(400), as bots.xml does for XML.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from bots.base import CallbackRejected

MAX_DEPTH = 64  # real payloads nest about 5 levels (mixed.msg_item[].text.content)
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins escaped pairs, so any left is a lone one


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


def _no_constant(literal: str) -> NoReturn:
    raise ValueError(f"{literal} is not JSON")


def parse_json_object(data: bytes | str, what: str) -> dict[str, Any]:
    """`data` (UTF-8) as a JSON object, checked as the module docstring says; `what` names it in the error."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError as exc:
        raise CallbackRejected("json_too_deep", 400, f"{what} is nested too deeply") from exc
    except ValueError as exc:  # also UnicodeDecodeError, and integers past Python's 4300 digits
        raise CallbackRejected("malformed_json", 400, f"{what} is not valid JSON") from exc
    if not isinstance(value, dict):
        raise CallbackRejected("malformed_json", 400, f"{what} must be a JSON object")
    _check_tree(value, what)
    return value


def _check_tree(value: dict[str, Any], what: str) -> None:
    """Depth and lone surrogates, walked without recursion."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise CallbackRejected("json_too_deep", 400, f"{what} is nested more than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            pending.extend((key, depth) for key in item)
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
        elif isinstance(item, str) and _SURROGATE.search(item):
            raise CallbackRejected("bad_unicode", 400, f"{what} holds a lone UTF-16 surrogate")


def object_field(payload: Mapping[str, Any], key: str) -> dict[str, Any]:
    """`payload[key]` as an object: {} when absent or null, CallbackRejected(400) when it is anything else."""
    value = payload.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CallbackRejected("malformed_fields", 400, f"{key} must be a JSON object")
    return value
