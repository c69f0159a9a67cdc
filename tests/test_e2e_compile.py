"""The compile job (lmperf.kinds.e2e.compile_job): cold compiles side by side, then warm measured cells."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from lmperf.core.record import load_record
from lmperf.kinds.e2e import compile_job as e2e_compile
from lmperf.kinds.e2e.report import compile_job_sentence


def cells(*names):
    return [e2e_compile.parse_cell(n) for n in names]


def test_plan_starts_the_largest_models_first_and_shares_the_cpus():
    todo = cells("small:128:fp32", "2.7B:128:fp32", "medium:512:fp32", "2.7B:512:fp32", "xl:256:fp32")
    at_once, threads, order = e2e_compile.plan(todo, None, 16)
    assert (at_once, threads) == (5, 3)  # 16 CPUs // 2 = 8 compiles, but there are only 5 cells
    assert [(c["model"], c["ctx"]) for c in order] == [
        ("2.7B", 512),
        ("2.7B", 128),
        ("xl", 256),
        ("medium", 512),
        ("small", 128),
    ]
    assert e2e_compile.plan(todo, 2, 16)[:2] == (2, 8)
    assert e2e_compile.plan(todo, None, 1)[:2] == (1, 1)


def test_a_compile_starts_when_its_memory_share_fits_beside_the_running_ones():
    big, xl, small = cells("2.7B:512:fp32", "xl:512:fp32", "small:128:fp32")
    assert 3.3e9 < e2e_compile.parameters(big) < 3.5e9  # 5 bytes each: ~17 GB
    share = e2e_compile.gpu_share_bytes
    overhead = e2e_compile.PROCESS_OVERHEAD_BYTES
    gpu = int((3 * (share(big) + overhead) + share(small) + overhead) / e2e_compile.USABLE_SHARE) + 1
    assert e2e_compile.next_to_start([big], [big, big], 8, gpu) == big  # a third fits
    assert e2e_compile.next_to_start([big, xl, small], [big] * 3, 8, gpu) == small  # the first that fits
    assert e2e_compile.next_to_start([big, xl], [big] * 3, 8, gpu) is None
    assert e2e_compile.next_to_start([big], [], 8, 10**9) == big  # alone, whatever it needs
    assert e2e_compile.next_to_start([small], [small, small], 2, None) is None  # the CPU limit
    assert e2e_compile.next_to_start([small], [small], 2, None) == small  # no GPU: CPUs alone


@pytest.mark.parametrize("text", ["small:128", "huge:128:fp32", "small:x:fp32", "small:128:fp16"])
def test_a_malformed_cell_is_refused(text):
    with pytest.raises(Exception, match="model:context:precision"):
        e2e_compile.parse_cell(text)


def test_patterns_must_name_every_axis(tmp_path, capsys):
    with pytest.raises(SystemExit):
        e2e_compile.parse_args(
            ["--output", str(tmp_path / "{model}.json"), "--cache", "c/{model}_{ctx}_{precision}", "--device", "cpu"]
            + ["--cells", "tiny:16:fp32"]
        )
    assert "--output must name {model}, {ctx} and {precision}" in capsys.readouterr().err


def job(tmp_path, *extra, cell="tiny:16:fp32"):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lmperf.cells", "e2e_compile", "--device", "cpu", "--cells", cell]
    cmd += ["--output", str(tmp_path / "{model}_ctx{ctx}_{precision}.json")]
    cmd += ["--cache", str(tmp_path / "cache/{model}_ctx{ctx}_{precision}"), "--batch-size", "2", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_a_failing_compile_fails_the_job_with_its_log(tmp_path):
    # vocabulary 0: drawing the tokens raises in the compile process before anything compiles
    done = job(tmp_path, "--vocab-size", "0")
    assert done.returncode == 1
    assert "FAILED" in done.stdout and "0 of 1 compiled" in done.stdout
    assert "Traceback" in done.stderr and "tiny ctx 16 fp32" in done.stderr
    assert not (tmp_path / "tiny_ctx16_fp32.json").exists()


@pytest.mark.slow
def test_the_job_compiles_cold_and_the_measured_cell_loads_its_graphs(tmp_path):
    cache = tmp_path / "cache/tiny_ctx16_fp32"
    cache.mkdir(parents=True)
    (cache / "left-over").write_text("from an earlier run")
    done = job(tmp_path, "--workers", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (cache / "left-over").exists()  # emptied: the compile was cold
    cold = load_record(tmp_path / "tiny_ctx16_fp32.json")
    assert cold["kind"] == "e2e_compile" and cold["cell"] == {
        "model": "tiny",
        "context_length": 16,
        "precision": "fp32",
    }
    m = cold["metrics"]
    assert m["compile_cache_hits"] == 0 and m["inductor_fxgraph_cache_misses"] > 0
    assert (
        m["training_first_step_ms"] > 0
        and m["inference_first_forward_ms"] > 0
        and cold["provenance"]["settings"]["concurrent_compiles"] == 1
    )
    # Dynamo's compile time is part of each first call's wall time
    assert 0 < m["training_compile_s"] < m["training_first_step_ms"] / 1e3
    assert 0 < m["inference_compile_s"] < m["inference_first_forward_ms"] / 1e3
    # the measured cell, with the same cache and thread count, compiles nothing; it runs with one
    # compile worker, as the workflow runs measured compiled cells: Inductor's cache keys leave the
    # worker count out, so the job's graphs (compiled with its default) are found all the same
    out = tmp_path / "measured.json"
    cmd = [sys.executable, "-m", "lmperf.cells", "e2e", "--output", str(out), "--device", "cpu", "--model", "tiny"]
    cmd += ["--context-length", "16", "--batch-size", "2", "--warmup-steps", "1", "--measured-steps", "2"]
    cmd += ["--compile", "compiled", "--compile-cache", str(cache), "--compile-threads", "1"]
    measured = subprocess.run(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    assert measured.returncode == 0, measured.stderr[-3000:]
    measured_record = load_record(out)
    assert measured_record["provenance"]["settings"]["compile_threads"] == 1
    warm = measured_record["metrics"]
    assert warm["compile_cache_hits"] == m["inductor_fxgraph_cache_misses"] + m["aot_autograd_cache_misses"]
    assert warm["inductor_fxgraph_cache_misses"] == warm["aot_autograd_cache_misses"] == 0
    assert warm["training_first_step_ms"] < m["training_first_step_ms"]
    assert warm["compile_s"] < m["training_compile_s"] + m["inference_compile_s"]  # loading, not compiling


def test_the_report_quotes_the_jobs_cold_compiles():
    start = pd.Timestamp("2026-11-23T10:00:00+00:00")
    cold = pd.DataFrame(
        {
            "model": ["small", "large", "large"],
            "context_length": [128, 128, 1024],
            "precision": ["fp32"] * 3,
            "cold_train_s": [31.5, 80.25, None],  # large at 1024 ran out of memory after compiling
            "cold_inference_s": [12.0, 30.5, 41.0],
            "concurrent": [2, 2, 2],
            "start": [start, start, start + pd.Timedelta(seconds=40)],
            "age_s": [35.0, 100.0, 200.0],
        }
    )
    text = compile_job_sentence(cold, "h100")
    assert "up to 2 cells at once" in text and "`results/h100/e2e_compile/`" in text
    # the range of the parts that ran (the out-of-memory training is left out), and the job's span:
    # 40 + 200 s from the first start to the last end
    assert "forward and backward) took 31.50 s–80.25 s and the no-grad graph 12.00 s–41.00 s" in text
    assert "The 3 compiles took 4.00 min of wall time" in text
    assert "share of the GPU's memory" in text and "share of" not in compile_job_sentence(cold, "cpu")
