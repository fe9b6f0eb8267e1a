"""How large a JSON schema's grammar would be, estimated from the schema before it is built.

llama.cpp's JSON-schema converter writes repetition out in full: ``minItems: 20000000`` becomes
a rule that names the item rule twenty million times (a 360-million-character grammar, seconds of
CPU and a GiB of memory), and so do ``maxItems``, ``minLength`` / ``maxLength`` and the ``{m,n}``
quantifiers of a ``pattern`` (nested groups multiply). This module walks the schema as the
converter would, adds up an upper estimate of the characters each part produces, and refuses
the schema with ``GrammarTooLarge`` naming the largest part when the sum passes the limit, so
no request makes the converter do that work.

Every branch a schema node could take is counted (the converter takes one), so the estimate
errs high; references (``$ref``) cost their name, and the definitions they point to are counted
once each, as the converter builds each referenced rule once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshnet.core.errors import GrammarTooLarge
from meshnet.core.sampling_options import MAX_GRAMMAR_CHARS

MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of schema nodes accepted (the converter recurses once per level)."""
BUILTIN_RULES_CHARS = 2048
"""The primitive rules (value, object, string, number ...) a grammar may carry."""
_CAP = 10**15
"""Counts are clamped here: an estimate only has to say "too large", never how much."""
_REPEATED_KEYWORDS = ("minItems", "maxItems", "minLength", "maxLength")


@dataclass
class _Part:
    chars: int = 0
    what: str = ""


class _Exceeded(Exception):
    """The running estimate passed the limit: the walk stops there (its cost is bounded too)."""


class _Estimate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = BUILTIN_RULES_CHARS
        self.largest = _Part()

    def add(self, chars: int, what: str) -> None:
        chars = min(chars, _CAP)
        self.total = min(self.total + chars, _CAP)
        if chars > self.largest.chars:
            self.largest = _Part(chars, what)
        if self.total > self.limit:
            raise _Exceeded

    def visit(self, schema: Any, name: str, depth: int) -> None:
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarTooLarge(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels (at {name})")
        if not isinstance(schema, Mapping):
            self.add(16, name)
            return
        self.add(len(name) + 8, name)
        if isinstance(schema.get("$ref"), str):
            self.add(2 * len(schema["$ref"]) + 8, name)
        for keyword in ("oneOf", "anyOf", "allOf", "prefixItems"):
            self._visit_list(schema.get(keyword), f"{name}-{keyword}", depth)
        for keyword in ("$defs", "definitions"):
            self._visit_map(schema.get(keyword), f"{name}-{keyword}", depth)
        if isinstance(schema.get("type"), list):
            self.add(16 * len(schema["type"]), name)
        if "const" in schema:
            self.add(2 * _json_chars(schema["const"]) + 8, f"const at {name}")
        if isinstance(schema.get("enum"), list):
            self.add(_bounded_sum(schema["enum"], self.limit), f"enum at {name}")
        self._visit_object(schema, name, depth)
        self._visit_array(schema, name, depth)
        self._visit_string(schema, name)

    def _visit_list(self, schemas: Any, name: str, depth: int) -> None:
        if isinstance(schemas, list):
            for index, alternative in enumerate(schemas):
                self.visit(alternative, f"{name}-{index}", depth + 1)
                self.add(len(name) + 8, name)

    def _visit_map(self, schemas: Any, name: str, depth: int) -> None:
        if isinstance(schemas, Mapping):
            for key, definition in schemas.items():
                self.visit(definition, f"{name}-{key}", depth + 1)

    def _visit_object(self, schema: Mapping[str, Any], name: str, depth: int) -> None:
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            required: list[Any] = schema["required"] if isinstance(schema.get("required"), list) else []
            kv_names = 0
            for key, value in properties.items():
                prop = f"{name}-{key}"
                self.visit(value, prop, depth + 1)
                self.add(3 * len(prop) + 2 * len(str(key)) + 24, prop)
                kv_names += len(prop) + 4
            optional = len([key for key in properties if key not in required])
            # Each optional property gets a rule naming the ones after it (written once each, but
            # built in time quadratic in their count: the build's deadline bounds that part).
            average = kv_names // max(len(properties), 1)
            self.add(optional * (2 * average + 32), f"{optional} optional properties at {name}")
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            self.visit(additional, f"{name}-additional-value", depth + 1)
        if isinstance(schema.get("items"), Mapping):
            self.visit(schema["items"], f"{name}-item", depth + 1)
        elif isinstance(schema.get("items"), list):
            self._visit_list(schema["items"], f"{name}-tuple", depth)

    def _visit_array(self, schema: Mapping[str, Any], name: str, depth: int) -> None:
        item = len(f"{name}-item") + 16  # the item rule's name, a separator, a bracket
        for keyword in ("minItems", "maxItems"):
            self.add(_count(schema.get(keyword)) * item, f"{keyword} {schema.get(keyword)} at {name}")

    def _visit_string(self, schema: Mapping[str, Any], name: str) -> None:
        for keyword in ("minLength", "maxLength"):
            self.add(_count(schema.get(keyword)) * 8, f"{keyword} {schema.get(keyword)} at {name}")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            self.add(pattern_chars(pattern, self.limit), f"pattern {pattern[:40]!r} at {name}")


def grammar_chars_estimate(schema: Mapping[str, Any], limit: int = _CAP) -> tuple[int, str]:
    """An upper estimate of the characters of ``schema``'s grammar, and its largest part; the
    walk stops as soon as the estimate passes ``limit`` (then only "more than ``limit``" is known)."""
    estimate = _Estimate(limit)
    with contextlib.suppress(_Exceeded):
        estimate.visit(schema, "root", 0)
    return estimate.total, estimate.largest.what


def check_grammar_size(schema: Mapping[str, Any], limit: int = MAX_GRAMMAR_CHARS) -> None:
    """Refuse ``schema`` with ``GrammarTooLarge`` when its grammar would pass ``limit`` characters.

    Every part of a schema adds at least 16 characters, so the walk stops within a few thousand
    nodes however large the schema: the check costs milliseconds on the event loop."""
    total, largest = grammar_chars_estimate(schema, limit)
    if total > limit:
        shown = f"{total}" if total < _CAP else f"over {_CAP}"
        raise GrammarTooLarge(
            f"the JSON schema's grammar would be at least about {shown} characters (largest part: {largest}); "
            f"this server builds grammars of at most {limit} characters: lower {', '.join(_REPEATED_KEYWORDS)}, "
            "pattern quantifiers, enums or optional properties"
        )


def pattern_chars(pattern: str, limit: int = _CAP) -> int:
    """An upper estimate of the grammar of a ``pattern``: a quantifier repeats its atom (a group:
    everything in it, so nested quantifiers multiply). Stops once past ``limit``."""
    groups = [0]
    last = 0  # the cost of the atom a quantifier would repeat
    spent = 0  # everything added so far, each part once: the early stop's measure
    index = 0
    while index < len(pattern) and spent <= limit:
        char = pattern[index]
        end = pattern.find("}", index, index + 40) if char == "{" else -1
        if end > 0:
            times = max(1, max(_count(part) for part in pattern[index + 1 : end].split(",")))
            added, last, index = min(last * times, _CAP), min(last * times, _CAP), end + 1
        elif char in "*+?":
            added, index = last + 4, index + 1
        elif char == "(":
            groups.append(0)
            last, index, spent = 0, index + 1, spent + 2  # the group's own brackets
            continue
        else:
            closing = char == ")"
            last, index = _atom(pattern, index, groups)
            added = last
            spent -= last - 4 if closing else 0  # a group's inside was counted as it came
        groups[-1] = min(groups[-1] + added, _CAP)
        spent = min(spent + added, _CAP)
    return min(max(sum(groups), spent) + len(pattern), _CAP)


def _atom(pattern: str, index: int, groups: list[int]) -> tuple[int, int]:
    """The cost of the atom at ``index`` and the index after it (a closing ``)`` ends a group)."""
    char = pattern[index]
    if char == ")":
        inner = groups.pop() if len(groups) > 1 else 0
        return inner + 4, index + 1
    if char == "\\":
        return 8, index + 2
    if char == "[":
        end = index + 1
        while end < len(pattern) and pattern[end] != "]":
            end += 2 if pattern[end] == "\\" else 1
        return end - index + 4, end + 1
    return 4, index + 1


def _count(value: Any) -> int:
    """A repetition count as the converter would use it (a non-count repeats nothing)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, min(value, _CAP))
    if isinstance(value, str) and value.strip().isdigit():
        return min(int(value.strip()[:16]), _CAP)
    return 0


def _json_chars(value: Any) -> int:
    return len(json.dumps(value))


def _bounded_sum(values: list[Any], limit: int) -> int:
    """The grammar of an enum's alternatives (each a quoted literal), counted until past ``limit``."""
    total = 0
    for value in values:
        total += 2 * _json_chars(value) + 4
        if total > limit:
            break
    return total
