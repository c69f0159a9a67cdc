"""config.yaml against its schema (lmperf.core.config): the CPU grid as overrides of the GPU grid,
every bad value named with its key, every unknown key with the closest known one, defaults filled
from the schema alone."""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from conftest import REPO

from lmperf import attention
from lmperf.core import config as lmconfig
from lmperf.core.sizes import SIZES


@pytest.fixture
def config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_the_shipped_config_is_valid_and_its_cpu_grid_overrides_the_gpu_grid(config):
    raw = copy.deepcopy(config)
    lmconfig.validate(config)
    gpu, cpu = lmconfig.grid(config, "h100"), lmconfig.grid(config, "cpu")
    assert gpu is config["grids"]["gpu"] and lmconfig.grid(config, "h200") is gpu
    assert cpu["e2e"]["warmup_steps"] == raw["grids"]["cpu"]["e2e"]["warmup_steps"]  # overridden
    assert cpu["e2e"]["batch_size"] == raw["grids"]["gpu"]["e2e"]["batch_size"]  # inherited
    assert cpu["e2e"]["main"] == raw["grids"]["cpu"]["e2e"]["main"]  # a table of the override's own


def test_overlay_merges_tables_replaces_the_rest_and_drops_keys_set_to_null():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 2, "c": {"z": 3}, "d": 4}
    override = {"a": {"y": [3], "w": 0}, "c": None, "e": {"v": 1}}
    assert lmconfig.overlay(base, override) == {"a": {"x": 1, "y": [3], "w": 0}, "b": 2, "d": 4, "e": {"v": 1}}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 2, "c": {"z": 3}, "d": 4}  # neither argument changes


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("gpu.e2e.main.models", ["small", "huge"], "grids.gpu.e2e.main.models[1] = 'huge'"),
        ("gpu.e2e.main.context_lengths", [128, 0], "context_lengths[1] = 0: 0 is less than the minimum of 1"),
        ("cpu.e2e.main.context_lengths", [-5], "grids.cpu.e2e.main.context_lengths[0] = -5"),
        ("gpu.e2e.main.context_lengths", [128.5], "context_lengths[0] = 128.5: 128.5 is not of type 'integer'"),
        ("gpu.e2e.main.precisions", ["fp8"], "grids.gpu.e2e.main.precisions[0] = 'fp8'"),
        ("gpu.e2e.main.models", [], "grids.gpu.e2e.main.models = []: [] should be non-empty"),
        ("cpu.e2e.warmup_sweep.warmup_steps", [], "grids.cpu.e2e.warmup_sweep.warmup_steps = []"),
        ("gpu.attention.batch_size", 0, "grids.gpu.attention.batch_size = 0"),
    ],
)
def test_each_bad_value_is_named_with_its_key(config, path, value, expected):
    *parents, key = path.split(".")
    node = config["grids"]
    for part in parents:
        node = node[part]
    node[key] = value
    with pytest.raises(lmconfig.ConfigError) as err:
        lmconfig.validate(config)
    assert expected in str(err.value)


def rename(node: dict, old: str, new: str) -> None:
    node[new] = node.pop(old)


@pytest.mark.parametrize(
    "where, old, new",
    [
        ("", "device", "devise"),
        ("grids", "cpu", "cpus"),
        ("grids.gpu", "attention", "attentoin"),
        ("grids.cpu", "attention", "attentoin"),
        ("grids.gpu.e2e", "warmup_steps", "warmup_step"),
        ("grids.cpu.e2e.main", "models", "model"),
        ("grids.cpu.flash.correctness", "shapes", "shape"),
        ("grids.gpu.precision.toy_model", "batch_size", "batchsize"),
    ],
)
def test_an_unknown_key_at_any_level_gets_one_line_with_the_close_match(config, where, old, new):
    node = config
    for part in filter(None, where.split(".")):
        node = node[part]
    rename(node, old, new)
    with pytest.raises(lmconfig.ConfigError) as err:
        lmconfig.validate(config)
    unknown = ".".join(filter(None, [where, new]))
    assert str(err.value) == f"invalid config (config.yaml or --config): unknown key {unknown}: did you mean {old!r}?"


def test_report_only_takes_booleans_and_their_words_only(config):
    for value, expected in (("true", True), ("False", False), (True, True)):
        assert lmconfig.validate({**config, "report_only": value})["report_only"] is expected
    with pytest.raises(lmconfig.ConfigError, match=r"report_only = 'maybe': use true or false$"):
        lmconfig.validate({**config, "report_only": "maybe"})


def test_the_schema_fills_every_default(config):
    """Rules and cells read settings with no fallback: a setting left out gets the schema's default."""
    attention_grid = config["grids"]["gpu"]["attention"]
    for key in ("batch_size", "max_phase_seconds", "compile_dynamic"):
        del attention_grid[key]
    del config["grids"]["gpu"]["precision"]["layer_norm"]
    lmconfig.validate(config)
    for grid in config["grids"].values():  # the CPU grid inherits the filled-in GPU values
        assert (grid["attention"]["batch_size"], grid["attention"]["compile_dynamic"]) == (8, True)
    assert config["grids"]["gpu"]["attention"]["max_phase_seconds"] == 1.5
    assert config["grids"]["gpu"]["precision"]["layer_norm"]["dtypes"] == ["fp16", "bf16", "fp32"]
    assert config["report_only"] is False


def test_the_schemas_lists_of_names_are_the_codes():
    text = lmconfig.SCHEMA_PATH.read_text()
    schema = yaml.safe_load(text)
    assert set(schema["definitions"]["model_list"]["items"]["enum"]) == set(SIZES)
    lines = text.splitlines()
    marked = [i for i, line in enumerate(lines) if "must match lmperf.attention.IMPLEMENTATIONS" in line]
    assert marked
    for i in marked:
        enum = next(yaml.safe_load(line.split(":", 1)[1]) for line in lines[i + 1 :] if re.search(r"\benum:", line))
        assert set(enum["enum"]) == set(attention.IMPLEMENTATIONS), lines[i + 1]
