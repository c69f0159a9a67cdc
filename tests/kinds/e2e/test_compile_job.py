"""The compile job: its plan, its GPU memory shares, a failing compile, and cold compiles that the
measured compiled cell then loads (CPU grid jobs through the runner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lmperf.core.record import load_record
from lmperf.kinds.e2e import compile_job as C
from tests.conftest import cpu_jobs, run_job


def cells(*specs: str) -> list[dict]:
    return [{"model": m, "context_length": int(c), "precision": "fp32"} for m, c in (s.split(":") for s in specs)]


def test_plan_starts_the_largest_models_first_and_shares_the_cpus():
    at_once, threads, order = C.plan(cells("small:128", "2.7B:128", "medium:512", "2.7B:512", "xl:256"), 16)
    assert (at_once, threads) == (5, 3)  # 16 CPUs // 2 = 8 compiles, but there are only 5 cells
    assert order == cells("2.7B:512", "2.7B:128", "xl:256", "medium:512", "small:128")
    assert C.plan(cells("small:128"), 1)[:2] == (1, 1)


def test_a_compile_starts_when_its_memory_share_fits_beside_the_running_ones():
    big, xl, small = cells("2.7B:512", "xl:512", "small:128")
    assert 3.3e9 < C.gpu_share_bytes(big) / C.MEMORY_PER_PARAMETER_BYTES < 3.5e9
    share = lambda c: C.gpu_share_bytes(c) + C.PROCESS_OVERHEAD_BYTES  # noqa: E731
    gpu = int((3 * share(big) + share(small)) / C.USABLE_SHARE) + 1
    assert C.next_to_start([big], [big, big], 8, gpu) == big  # a third fits
    assert C.next_to_start([big, xl, small], [big] * 3, 8, gpu) == small  # the first that fits
    assert C.next_to_start([big, xl], [big] * 3, 8, gpu) is None
    assert C.next_to_start([big], [], 8, 10**9) == big  # alone, whatever it needs
    assert C.next_to_start([small], [small, small], 2, None) is None  # the CPU limit
    assert C.next_to_start([small], [small], 2, None) == small  # no GPU: the CPUs alone


def jobs(tmp_path, **settings):
    """The CPU grid's compile job (its caches under tmp_path) and its measured compiled cell."""
    compile_, measured = (j for j in cpu_jobs("e2e", tmp_path) if j.cell == "e2e_compile" or "compiled" in j.name)
    cache = str(tmp_path / "cache" / "{model}_ctx{context_length}_{precision}")
    compile_ = dataclasses.replace(compile_, settings={**compile_.settings, "cache": cache, **settings})
    measured_cache = cache.format(**measured.records[measured.output])
    return compile_, dataclasses.replace(measured, settings={**measured.settings, "compile_cache": measured_cache})


def test_a_failing_compile_fails_the_job_with_its_log(tmp_path):
    compile_, _ = jobs(tmp_path, vocab_size=0)  # drawing the tokens raises before anything compiles
    with pytest.raises(AssertionError, match=r"(?s)last 40 lines.*Traceback"):
        run_job(compile_, cwd=tmp_path)
    assert not any(Path(p).exists() for p in compile_.records)


@pytest.mark.slow
def test_the_job_compiles_cold_and_the_measured_cell_loads_its_graphs(tmp_path):
    compile_, measured = jobs(tmp_path)
    left_over = Path(measured.settings["compile_cache"], "left-over")
    left_over.parent.mkdir(parents=True)
    left_over.write_text("from an earlier run")
    run_job(compile_, cwd=tmp_path)  # the cache emptied first: the compile is cold
    (path,) = compile_.records
    cold = load_record(path)
    m = cold["metrics"]
    assert cold["kind"] == "e2e_compile" and cold["cell"] == compile_.records[path] and not left_over.exists()
    assert m["compile_cache_hits"] == 0 and m["compile_cache_misses"] > 0 and m["concurrent_compiles"] == 1
    # Dynamo's compile time is part of each first call's wall time
    assert 0 < m["training_compile_s"] < m["training_first_step_ms"] / 1e3
    assert 0 < m["inference_compile_s"] < m["inference_first_forward_ms"] / 1e3
    # the measured cell, with one compile thread (the job compiled with more: the cache keys leave it out),
    # finds every graph the job compiled and compiles nothing
    run_job(measured, cwd=tmp_path)
    warm = load_record(measured.output)["metrics"]
    assert warm["compile_cache_hits"] == m["compile_cache_misses"] and warm["compile_cache_misses"] == 0
    assert warm["compile_s"] < m["training_compile_s"] + m["inference_compile_s"]  # loading, not compiling
