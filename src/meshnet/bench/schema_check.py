"""A small JSON Schema validator: the subset ``results.schema.json`` uses, and nothing more.

Supported keywords: ``type`` (one or a list), ``required``, ``properties``,
``additionalProperties`` (bool or schema), ``patternProperties``, ``items``, ``enum``,
``const``, ``minimum``, ``maximum``, ``minItems``, ``$ref`` to ``#/$defs/NAME``. An unknown
keyword is an error, so the schema can never silently ask for a check this code does not make.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from meshnet.core.errors import InvalidArgument

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "null": (type(None),),
}
_KNOWN = {
    "type",
    "required",
    "properties",
    "additionalProperties",
    "patternProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "minItems",
    "$ref",
    "$defs",
    "$schema",
    "$id",
    "title",
    "description",
}


def load_schema() -> dict[str, Any]:
    """The results schema shipped with the package."""
    text = resources.files("meshnet.bench").joinpath("results.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def _is_type(value: object, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False  # JSON booleans are not numbers, although Python says they are ints
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def validate(instance: object, schema: dict[str, Any]) -> list[str]:
    """Every violation as ``path: message``; an empty list means the instance is valid."""
    errors: list[str] = []
    _check(instance, schema, schema, "$", errors)
    return errors


def _check(value: object, schema: dict[str, Any], root: dict[str, Any], path: str, errors: list[str]) -> None:
    unknown = set(schema) - _KNOWN
    if unknown:
        raise InvalidArgument(f"schema at {path} uses unsupported keywords {sorted(unknown)}")
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise InvalidArgument(f"schema at {path}: only #/$defs/ references are supported, got {ref}")
        _check(value, root["$defs"][ref[len("#/$defs/") :]], root, path, errors)
        return
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is_type(value, n) for n in names):
            errors.append(f"{path}: expected {' or '.join(names)}, got {type(value).__name__}")
            return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: expected at least {schema['minItems']} items, got {len(value)}")
        if "items" in schema:
            for index, item in enumerate(value):
                _check(item, schema["items"], root, f"{path}[{index}]", errors)
    if isinstance(value, dict):
        _check_object(value, schema, root, path, errors)


def _check_object(
    value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any], path: str, errors: list[str]
) -> None:
    for name in schema.get("required", []):
        if name not in value:
            errors.append(f"{path}: missing required property {name!r}")
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        where = f"{path}.{key}"
        matched = False
        if key in properties:
            matched = True
            _check(item, properties[key], root, where, errors)
        for pattern, subschema in patterns.items():
            if re.search(pattern, key):
                matched = True
                _check(item, subschema, root, where, errors)
        if not matched:
            if extra is False:
                errors.append(f"{path}: unexpected property {key!r}")
            elif isinstance(extra, dict):
                _check(item, extra, root, where, errors)
