"""Config validation: every bad value fails at once, naming its key and the value."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from lmperf.core import config as lmconfig
from lmperf.core.sizes import SIZES


@pytest.fixture
def config(repo_root):
    return yaml.safe_load((repo_root / "config.yaml").read_text())


def test_shipped_config_is_valid(config):
    assert lmconfig.errors(config) == []


def test_schema_knows_exactly_the_registered_sizes(repo_root):
    schema = yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())
    assert set(schema["definitions"]["model_list"]["items"]["enum"]) == set(SIZES)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("grids", "gpu", "e2e", "main", "models"), ["small", "huge"], "grids.gpu.e2e.main.models[1] = 'huge'"),
        (
            ("grids", "gpu", "e2e", "main", "context_lengths"),
            [128, 0],
            "context_lengths[1] = 0: 0 is less than the minimum of 1",
        ),
        (("grids", "cpu", "e2e", "main", "context_lengths"), [-5], "grids.cpu.e2e.main.context_lengths[0] = -5"),
        (
            ("grids", "gpu", "e2e", "main", "context_lengths"),
            [128.5],
            "context_lengths[0] = 128.5: 128.5 is not of type 'integer'",
        ),
        (("grids", "gpu", "e2e", "main", "context_lengths"), ["512"], "context_lengths[0] = '512'"),
        (("grids", "gpu", "e2e", "main", "precisions"), ["fp8"], "grids.gpu.e2e.main.precisions[0] = 'fp8'"),
        (("grids", "gpu", "e2e", "main", "models"), [], "grids.gpu.e2e.main.models = []: [] should be non-empty"),
        (("grids", "cpu", "e2e", "warmup_sweep", "warmup_steps"), [], "warmup_sweep.warmup_steps = []"),
        (("grids", "gpu", "e2e", "measured_steps"), 0, "grids.gpu.e2e.measured_steps = 0"),
    ],
)
def test_each_bad_value_is_named(config, path, value, expected):
    bad = copy.deepcopy(config)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(lmconfig.ConfigError) as err:
        lmconfig.validate(bad)
    assert expected in str(err.value)


def test_a_misspelt_key_gets_one_line_with_the_close_match(config):
    bad = copy.deepcopy(config)
    bad["grids"]["gpu"]["e2e"]["main"]["model"] = bad["grids"]["gpu"]["e2e"]["main"].pop("models")
    assert lmconfig.errors(bad) == ["unknown key grids.gpu.e2e.main.model: did you mean 'models'?"]
    bad = copy.deepcopy(config)
    bad["devise"] = "h100"
    assert lmconfig.errors(bad) == ["unknown key devise: did you mean 'device'?"]


@pytest.mark.parametrize("value, expected", [("true", True), ("False", False), (True, True)])
def test_report_only_takes_booleans(config, value, expected):
    assert lmconfig.validate({**config, "report_only": value})["report_only"] is expected


def test_report_only_maybe_is_an_error(config):
    assert lmconfig.errors({**config, "report_only": "maybe"}) == ["report_only = 'maybe': use true or false"]
    with pytest.raises(lmconfig.ConfigError):
        lmconfig.validate({**config, "report_only": "maybe"})


def test_schema_defaults_are_filled_once(config):
    """Rules read config[...] with no fallback: every optional setting gets the schema's default."""
    trimmed = copy.deepcopy(config)
    attention = trimmed["grids"]["gpu"]["attention"]
    for key in ("batch_size", "max_phase_seconds", "compile_dynamic"):
        del attention[key]
    del trimmed["grids"]["gpu"]["precision"]["layer_norm"]
    lmconfig.validate(trimmed)
    assert (attention["batch_size"], attention["max_phase_seconds"], attention["compile_dynamic"]) == (8, 1.5, True)
    assert trimmed["grids"]["gpu"]["precision"]["layer_norm"]["dtypes"] == ["fp16", "bf16", "fp32"]
    assert trimmed["report_only"] is False


def test_snakemake_fails_before_any_job_on_a_bad_config(repo_root, tmp_path):
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text(
        "grids:\n  cpu:\n    e2e:\n      main:\n        models: [tiny]\n"
        "        context_lengths: [0]\n        precisions: [fp32]\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "all", "--configfile", str(bad_config), "--cores", "1"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "grids.cpu.e2e.main.context_lengths[0] = 0" in result.stdout + result.stderr


def test_attention_compare_names_the_registered_implementations(repo_root):
    import lmperf.attention

    schema = yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())
    items = schema["definitions"]["e2e"]["properties"]["attention_compare"]["properties"]["attentions"]["items"]
    assert set(items["enum"]) == set(lmperf.attention.IMPLEMENTATIONS)
