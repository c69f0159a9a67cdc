"""Validation of config.yaml against workflow/schemas/config.schema.yaml, with clear messages.

Every violation is reported with the key path and the offending value, e.g.
``grids.gpu.e2e.main.context_lengths[1] = 0: 0 is less than the minimum of 1``.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    pass


def _key_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def errors(config: dict, schema_path: Path = SCHEMA_PATH) -> list[str]:
    """All schema violations of ``config``, one readable line each (empty when valid)."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    lines = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        lines.append(f"{_key_path(err.absolute_path)} = {err.instance!r}: {err.message}")
    return lines


def validate(config: dict, schema_path: Path = SCHEMA_PATH) -> None:
    """Raise ConfigError naming every bad key and value."""
    problems = errors(config, schema_path)
    if problems:
        raise ConfigError("invalid config.yaml:\n  " + "\n  ".join(problems))
