"""config.yaml checked against workflow/schemas/config.schema.yaml (the one home of every default), its
defaults filled in; ``grids.cpu`` is laid over ``grids.gpu`` key by key. Each violation is one line with
its key path and value; a misspelt key gets the closest known name.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"
# `--config report_only=true` arrives as a string; only these spellings are booleans
BOOLEAN_WORDS = {"true": True, "false": False}


class ConfigError(ValueError):
    pass


def _key_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _schema(schema_path: Path) -> dict:
    return yaml.safe_load(Path(schema_path).read_text())


def _unknown_keys(err: jsonschema.ValidationError) -> list[str]:
    """One line per unexpected key of an additionalProperties error, with a close match."""
    allowed = sorted(err.schema.get("properties", {}))
    lines = []
    for key in sorted(set(err.instance) - set(allowed)):
        where = _key_path([*err.absolute_path, key])
        match = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"did you mean {match[0]!r}?" if match else f"known keys: {', '.join(allowed)}"
        lines.append(f"unknown key {where}: {hint}")
    return lines


def errors(config: dict, schema_path: Path = SCHEMA_PATH) -> list[str]:
    """All schema violations of ``config`` (its CPU grid already laid over), one line each."""
    validator = jsonschema.Draft202012Validator(_schema(schema_path))
    found = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    # while the GPU grid has a mistake the CPU grid (laid over it) repeats it: say it once
    if any(tuple(e.absolute_path)[:2] == ("grids", "gpu") for e in found):
        found = [e for e in found if tuple(e.absolute_path)[:2] != ("grids", "cpu")]
    # a misspelt key also leaves a required one missing: its unknown-key line says both
    misspelt_at = {tuple(e.absolute_path) for e in found if e.validator == "additionalProperties"}
    lines = []
    for err in found:
        if err.validator == "required" and tuple(err.absolute_path) in misspelt_at:
            continue
        if err.validator == "additionalProperties":
            lines.extend(_unknown_keys(err))
        elif err.validator == "type" and err.validator_value == "boolean":
            lines.append(f"{_key_path(err.absolute_path)} = {err.instance!r}: use true or false")
        else:
            lines.append(f"{_key_path(err.absolute_path)} = {err.instance!r}: {err.message}")
    return lines


def _fill_defaults(instance, schema: dict, root: dict) -> None:
    """Set every missing property that has a schema default, recursing into present objects."""
    if "$ref" in schema:
        node = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        _fill_defaults(instance, node, root)
    for sub in schema.get("allOf", []):
        _fill_defaults(instance, sub, root)
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = sub["default"]
        if key in instance:
            _fill_defaults(instance[key], sub, root)


def overlay(base, override):
    """``override`` laid over ``base``: tables merge key by key (a key set to null is dropped),
    anything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = {**base, **{k: overlay(base.get(k), v) if k in base else v for k, v in override.items()}}
        return {k: v for k, v in merged.items() if v is not None or k not in override}
    return override


def validate(config: dict, schema_path: Path = SCHEMA_PATH) -> dict:
    """Check ``config`` and fill its defaults in place; raise ConfigError naming every bad key."""
    value = config.get("report_only")
    if isinstance(value, str) and value.lower() in BOOLEAN_WORDS:
        config["report_only"] = BOOLEAN_WORDS[value.lower()]
    grids = config.get("grids")
    if isinstance(grids, dict) and isinstance(grids.get("gpu"), dict) and isinstance(grids.get("cpu"), dict):
        grids["cpu"] = overlay(grids["gpu"], grids["cpu"])
    problems = errors(config, schema_path)
    if problems:
        raise ConfigError("invalid config (config.yaml or --config): " + "; ".join(problems))
    schema = _schema(schema_path)
    _fill_defaults(config, schema, schema)
    return config


def is_slug(name: str) -> bool:
    """A device slug: lower-case letters, digits and dashes."""
    return re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) is not None


def grid(config: dict, device: str) -> dict:
    return config["grids"]["cpu" if device == "cpu" else "gpu"]
