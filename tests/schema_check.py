"""A validator for the part of JSON Schema that tb_gpuadvisor/schema/report.schema.json uses
(jsonschema is not a dependency): $ref into $defs, type, const, enum, properties, required,
additionalProperties, items, minimum, maximum. Any other keyword that
constrains values is refused, so the schema cannot quietly use one that is not checked."""

from __future__ import annotations

ANNOTATIONS = {"$schema", "$id", "$defs", "$comment", "title", "description", "x-exit-codes"}
KEYWORDS = {"$ref", "type", "const", "enum", "properties", "required", "additionalProperties",
            "items", "minimum", "maximum"}
TYPES = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "null": lambda v: v is None,
}


def errors(instance, schema: dict, root: dict | None = None, path: str = "$") -> list[str]:
    """Every place INSTANCE breaks SCHEMA, as "path: why" lines (empty: valid)."""
    root = root if root is not None else schema
    unknown = set(schema) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise ValueError(f"{path}: the schema uses keywords this validator does not check: {sorted(unknown)}")
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return errors(instance, root["$defs"][name], root, path)
    out: list[str] = []
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(TYPES[t](instance) for t in types):
            return [f"{path}: {type(instance).__name__} is not {' or '.join(types)}"]
    if "const" in schema and instance != schema["const"]:
        out.append(f"{path}: {instance!r} is not {schema['const']!r}")
    if "enum" in schema and instance not in schema["enum"]:
        out.append(f"{path}: {instance!r} is not one of {schema['enum']}")
    if TYPES["number"](instance):
        if "minimum" in schema and instance < schema["minimum"]:
            out.append(f"{path}: {instance} < {schema['minimum']}")
        if "maximum" in schema and instance > schema["maximum"]:
            out.append(f"{path}: {instance} > {schema['maximum']}")
    if isinstance(instance, list) and "items" in schema:
        for i, item in enumerate(instance):
            out += errors(item, schema["items"], root, f"{path}[{i}]")
    if isinstance(instance, dict):
        out += [f"{path}: {key!r} is missing" for key in schema.get("required", ()) if key not in instance]
        properties = schema.get("properties", {})
        for key, value in instance.items():
            where = f"{path}.{key}"
            if key in properties:
                out += errors(value, properties[key], root, where)
                continue
            extra = schema.get("additionalProperties", True)
            if extra is False:
                out.append(f"{where}: not in the schema")
            elif isinstance(extra, dict):
                out += errors(value, extra, root, where)
    return out


def validate(instance, schema: dict, definition: str | None = None) -> list[str]:
    """Errors of INSTANCE against the root schema, or against one of its $defs (DEFINITION)."""
    target = schema if definition is None else {"$ref": f"#/$defs/{definition}"}
    return errors(instance, target, schema)
