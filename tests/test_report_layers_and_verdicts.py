"""Reports read records and the pure layer only; their verdict words flip at named thresholds; the
numbers their sentences cite agree with the tables they summarise."""

from __future__ import annotations

import copy
import functools
import math
import pkgutil
import re
import statistics
import subprocess
import sys

import pandas as pd
import pytest

import lmperf.report
from lmperf.kinds.attention import report as attention_report
from lmperf.kinds.e2e import report as e2e_report
from lmperf.kinds.memory import report as memory_report
from lmperf.kinds.nsys import report as nsys_report
from lmperf.kinds.precision import report as precision_report
from lmperf.report.devices import SAME


def test_report_modules_import_no_torch():
    modules = ["lmperf.core.peaks", "lmperf.kinds.memory.account", "lmperf.core.sizes"] + [
        f"lmperf.report.{m.name}" for m in pkgutil.iter_modules(lmperf.report.__path__)
    ]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "bad = [m for m in ('torch', 'triton') if m in sys.modules]\nprint(bad)\nraise SystemExit(bool(bad))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# -- e2e: negligible variability (LOW_CV) and launch-bound (LAUNCH_BOUND_GROWTH) -------------------


def _e2e_rows(cv_small: float, growth: float) -> pd.DataFrame:
    rows = []
    for model, base in (("small", 10.0), ("xl", 100.0)):
        for ctx, ms in ((128, base), (256, base * (growth if model == "small" else 2.0))):
            cv = cv_small if (model, ctx) == ("small", 128) else 0.001
            rows.append(
                {
                    "model": model,
                    "context_length": ctx,
                    "precision": "fp32",
                    "compile": "eager",
                    "warmup_steps": 5,
                    "training_status": "ok",
                    "forward_ms_mean": ms,
                    "forward_ms_median": ms,
                    "backward_ms_mean": 2 * ms,
                    "forward_cv": cv,
                    "backward_cv": 0.001,
                }
            )
    return pd.DataFrame(rows)


def test_variability_verdict_flips_at_low_cv():
    below = _e2e_rows(e2e_report.LOW_CV * 0.9, 1.0)
    above = _e2e_rows(e2e_report.LOW_CV * 1.1, 1.0)
    quiet = e2e_report.variability_text(below, below, 5)
    noisy = e2e_report.variability_text(above, above, 5)
    assert "negligible everywhere" in quiet and "above it only" not in quiet
    assert "above it only for small/128" in noisy and "negligible everywhere" not in noisy
    assert f"under {100 * e2e_report.LOW_CV:.0f}% (`LOW_CV`" in noisy


def test_launch_bound_flips_at_growth_threshold():
    bound = _e2e_rows(0.2, e2e_report.LAUNCH_BOUND_GROWTH * 0.9)
    compute = _e2e_rows(0.2, e2e_report.LAUNCH_BOUND_GROWTH * 1.1)
    assert "1 of 1 are launch-bound (small/128: " in e2e_report.variability_text(bound, bound, 5)
    assert "CPU launch jitter, not too few warm-up steps." in e2e_report.variability_text(bound, bound, 5)
    text = e2e_report.variability_text(compute, compute, 5)
    # none launch-bound: the spread is not put down to launch jitter
    assert "None of the 1 of them with a cell at twice the context is launch-bound" in text
    assert "by at least 1.30×" in text and "launch jitter" not in text and "0 of 1" not in text


def test_launch_bound_names_the_cells_on_each_side_and_says_cpu_words_on_a_cpu():
    df = _e2e_rows(0.2, e2e_report.LAUNCH_BOUND_GROWTH * 0.9)
    # a second noisy cell that is not launch-bound: xl/128 (its time doubles with the context)
    df.loc[(df.model == "xl") & (df.context_length == 128), "forward_cv"] = 0.2
    text = e2e_report.variability_text(df, df, 5)
    assert "Of those, 1 of 2 are launch-bound (small/128: " in text
    assert "The other 1 (xl/128) are not launch-bound by that test." in text
    assert "not too few warm-up steps" not in text  # not every noisy cell is launch-bound
    noisy = df.assign(forward_cv=0.2)
    assert "in 0 of 4 cells; above it in every one: small/128" in e2e_report.variability_text(noisy, noisy, 5)
    cpu = e2e_report.variability_text(df, df, 5, "cpu")
    assert "overhead-bound (small/128: " in cpu and "launches kernels" not in cpu and "launch jitter" not in cpu


def test_variability_sentence_cites_the_table():
    df = _e2e_rows(0.123, 1.0)
    text = e2e_report.variability_text(df, df, 5)
    cited = re.search(r"small/128 \(([\d.]+)%\)", text).group(1)
    assert float(cited) == pytest.approx(100 * df.forward_cv.max(), abs=0.05)


def _timed_record(model: str, attention: str, deviation: float) -> dict:
    """An e2e record whose timer reads (1 + deviation) × its CUDA events in every phase sample."""
    events = [20.0, 30.0, 40.0]
    metrics = {}
    for phase in ("forward", "backward", "optimizer_step", "inference_forward"):
        metrics[f"{phase}_event_ms_samples"] = events
        metrics[f"{phase}_ms_samples"] = [e * (1 + deviation) for e in events]
    return {
        "status": "ok",
        "cell": {"model": model, "context_length": 128, "precision": "fp32", "compile": "eager", "warmup_steps": 5},
        "metrics": metrics,
        "provenance": {"settings": {"attention": attention}},
    }


def test_timer_check_names_its_cells_and_verdict_flips_at_agree_share():
    share = e2e_report.TIMER_AGREE_SHARE
    plain = [_timed_record("small", "plain", share / 2), _timed_record("medium", "plain", share * 2)]
    others = [_timed_record("small", "flash", 0.0), _timed_record("small", "sdpa", 0.0)]
    text = e2e_report.section_timer_check(plain, others)
    assert (
        "every sample longer than 10 ms in all 2 cells of the course's model (`plain` attention); the 2 cells " in text
    )
    assert "of `e2e.attention_compare` (the whole model with `flash`, `sdpa` attention) are left out." in text
    assert "every sample longer than 10 ms (deviation" not in text  # never "every sample" unqualified
    # the series of the cell within TIMER_AGREE_SHARE hold half of the 24 samples; the other's do not
    assert "24 phase samples over 10 ms in 8 (cell, phase) series" in text
    assert "within 2% (`TIMER_AGREE_SHARE`) hold 12 of them (50.0%)" in text
    table = _table(text, "### Step timer")
    assert list(table.columns) == [
        "phase",
        "samples over 10 ms",
        "median deviation (%)",
        "worst absolute deviation (%)",
    ]
    assert set(table.phase) == {"forward", "backward", "optimizer step", "inference forward"}
    assert set(table["worst absolute deviation (%)"]) == {f"{100 * share * 2:g}"}
    # a cell without a sample over the threshold is counted apart; no other attention: nothing left out
    short = _timed_record("tiny", "plain", 0.0)
    short["metrics"] = {k: [1.0] for k in short["metrics"]}
    text = e2e_report.section_timer_check([*plain, short])
    assert "in the 2 of the 3 cells of the course's model (`plain` attention) that have such samples." in text
    assert "left out" not in text


# -- memory: stage visibility (VISIBLE_SHARE) and the two peaks (BLOCK_SLACK_MIB) ------------------


def _training_metrics(backward_move: float) -> dict:
    peak = 1000.0
    return {
        "phases": [
            {"phase": "forward", "start_active_mib": 100, "end_active_mib": 400, "peak_active_mib": 400},
            {
                "phase": "backward",
                "start_active_mib": 400,
                "end_active_mib": 400 + backward_move,
                "peak_active_mib": 400 + backward_move,
            },
            {"phase": "optimizer_step", "start_active_mib": 500, "end_active_mib": 500, "peak_active_mib": peak},
            {"phase": "zero_grad", "start_active_mib": 500, "end_active_mib": 300, "peak_active_mib": 500},
        ]
    }


def test_stage_visibility_flips_at_visible_share():
    peak = 1000.0
    small = memory_report.VISIBLE_SHARE * peak * 0.5
    large = memory_report.VISIBLE_SHARE * peak * 2
    ok_small, failed = memory_report.stages_distinguishable(
        memory_report.stage_signatures(_training_metrics(small)), peak
    )
    ok_large, _ = memory_report.stages_distinguishable(memory_report.stage_signatures(_training_metrics(large)), peak)
    assert not ok_small and failed == ["backward changes active memory"]
    assert ok_large


def _memory_record(gap_per_allocation: float) -> dict:
    n = 100
    return {
        "status": "ok",
        "cell": {"model": "tiny", "context_length": 32, "precision": "fp32", "mode": "training", "batch_size": 4},
        "metrics": {
            "peak_allocated_mib": 1000 + gap_per_allocation * n,
            "replay_peak_active_mib": 1000.0,
            "live_allocations_at_peak": n,
        },
    }


def test_two_peaks_reconcile_only_within_block_slack():
    within = memory_report.two_peaks_text([_memory_record(memory_report.BLOCK_SLACK_MIB * 0.5)])
    beyond = memory_report.two_peaks_text([_memory_record(memory_report.BLOCK_SLACK_MIB * 2)])
    assert "within the" in within and "do not reconcile" not in within
    assert "do not reconcile" in beyond
    assert "0.50 MiB per allocation" in within  # the sentence cites the record's gap / live allocations


def test_memory_stage_table_matches_its_record():
    record = {
        "status": "ok",
        "cell": {"model": "tiny", "context_length": 32, "precision": "fp32", "mode": "training"},
        "metrics": {**_training_metrics(50), "replay_peak_active_mib": 1000.0, "peak_phase": "optimizer_step"},
    }
    (row,) = memory_report.stage_rows([record])
    assert row["zero_grad frees"] == f"{200 / 1024:.2f}"
    assert row["peak (phase)"] == f"{1000 / 1024:.2f} (optimizer_step)"


def _account_record(context_length: int) -> dict:
    """A measured 2.7B fp32 training cell, enough for the analytic account beside its breakdown."""
    return {
        "status": "ok",
        "cell": {"model": "2.7B", "context_length": context_length, "precision": "fp32", "mode": "training"}
        | {"batch_size": 4, "vocab_size": 10000},
        "metrics": {
            "breakdown_at_peak_mib": {"parameters": 1.0, "gradients": 1.0, "optimizer_state": 2.0, "other": 3.0},
            "saved_for_backward_mib": 1.0,
            "replay_peak_active_mib": 7.0,
            "peak_phase": "backward",
        },
    }


def test_analytic_peak_phase_follows_the_larger_total():
    from lmperf.core.sizes import config_from_name
    from lmperf.kinds.memory.account import analytic_account

    config = config_from_name("2.7B", vocab_size=10000)
    rows = {}
    for ctx in (128, 512):
        a = analytic_account(config, 4, ctx, "fp32", "training")
        rows[ctx] = a["end_of_forward_mib"] >= a["optimizer_step_mib"]
        records = [_account_record(ctx)]
        table = _table(memory_report._account_text(memory_report.frame(records), records), "| precision")
        phase = table["peak phase (meas / anal)"].iloc[0]
        want = memory_report.ANALYTIC_END_OF_FORWARD if rows[ctx] else memory_report.ANALYTIC_OPTIMIZER_STEP
        assert phase == f"backward / {want}"
        assert memory_report.frame(records).analytic_peak_phase.iloc[0] == want
    assert rows == {128: False, 512: True}  # one cell on each side: the label flips with the totals
    assert memory_report.analytic_peak_phase({"end_of_forward_mib": 2.0, "optimizer_step_mib": 1.0}) == "end of forward"
    assert memory_report.analytic_peak_phase({"end_of_forward_mib": 1.0, "optimizer_step_mib": 2.0}) == "optimizer_step"
    assert memory_report.analytic_peak_phase({"predicted_peak_phase": "forward"}) == "forward"  # inference


# -- attention: the allocator's "kept" against the hooks (KEPT_MISMATCH_SHARE) ---------------------


def _attention_df(alloc: float, hooks: float = 129.0) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "implementation": "flash",
                "head_dim": 128,
                "sequence_length": 32768,
                "retained_by_forward_mib": alloc,
                "retained_tensors_mib": hooks,
                "forward_peak_extra_mib": hooks,
                "baseline_allocated_mib": 705.0,
            }
        ]
    )


def test_kept_mismatch_note_flips_at_threshold():
    share = attention_report.KEPT_MISMATCH_SHARE
    assert attention_report.kept_mismatch_note(_attention_df(129 * (1 - share / 2)), "flash") == ""
    note = attention_report.kept_mismatch_note(_attention_df(0.0), "flash")
    assert "reads 0 MiB" in note and "129 MiB saved" in note


def test_reserved_but_unallocated_is_read_from_the_message():
    message = (
        "CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
        "10.94 GiB is free. Of the allocated memory 96.16 GiB is allocated by PyTorch, and 31.97 GiB is "
        "reserved by PyTorch but unallocated."
    )
    assert attention_report.reserved_unallocated_mib(message) == pytest.approx(31.97 * 1024)
    assert attention_report.reserved_unallocated_mib("no such text") is None


def test_flash_fp32_rows_say_tf32():
    def rec(settings):
        return {"cell": {"precision": "fp32"}, "provenance": {"settings": {"implementation": "flash", **settings}}}

    assert attention_report.products_paragraph([rec({})], "flash")[0] == "fp32 inputs, TF32 products"
    assert attention_report.products_paragraph([rec({"dot_precision": "ieee"})], "flash")[0] == (
        "fp32 inputs, IEEE float32 products"
    )
    assert attention_report.products_paragraph([rec({})], "plain") is None


# -- nsys: short kernel names and their legend ------------------------------------------------------


def test_short_kernel_names_have_a_legend():
    full = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_execute_kernel"
    short = nsys_report.compact_kernel_name(full)
    assert short == "xmma gemm f32f32 tn 128x128x8"
    legend = nsys_report.kernel_legend([full, "elementwise_kernel[MulFunctor]"])
    assert f"`{short}`: `{full}`" in legend and "MulFunctor" not in legend


def test_cublas_hopper_and_split_k_names_are_short_and_distinct():
    # Hopper nvjet GEMMs: tile M×N×K, cluster and layouts; names that differ only in the cluster stay apart
    a = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT"
    b = "nvjet_sm90_tst_256x128_64x4_1x4_h_bz_coopA_NTT"
    c = "nvjet_sm90_tst_48x64_64x15_2x1_v_bz_TNN"
    assert nsys_report.compact_kernel_name(a) == "nvjet 256x128x64 1x2 NTT"
    assert nsys_report.compact_kernel_name(b) == "nvjet 256x128x64 1x4 NTT"
    assert nsys_report.compact_kernel_name(c) == "nvjet 48x64x64 2x1 TNN"
    # a split-K xmma GEMM is not named like the plain one of the same tile
    plain = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_"
    short = nsys_report.compact_kernel_name(plain + "execute_kernel__5x_cublas")
    split = nsys_report.compact_kernel_name(plain + "execute_split_k_kernel__5x_cublas")
    assert short == "xmma gemm f32f32 tn 64x64x8" and split == "xmma gemm f32f32 tn 64x64x8 split-k"
    legend = nsys_report.kernel_legend([a, b, c])
    assert f"- `nvjet 256x128x64 1x2 NTT`: `{a}`" in legend and f"- `nvjet 48x64x64 2x1 TNN`: `{c}`" in legend
    # two names that still shorten alike are both listed, and the legend says so
    cut = "x" * nsys_report.SHORT_NAME_CHARS
    twins = nsys_report.kernel_legend([cut + "_one", cut + "_two"])
    assert f"`{cut}_one` or `{cut}_two` (one short name for these; the table does not tell them apart)" in twins


# -- every section's cited numbers against its own table, on the committed GPU records ----------------

from pathlib import Path  # noqa: E402

from lmperf.report.common import load  # noqa: E402

COMMITTED = sorted(p for p in Path(__file__).resolve().parents[1].glob("results/*/e2e") if p.parent.name != "cpu")
needs_records = pytest.mark.skipif(not COMMITTED, reason="no committed GPU records")


def device_with(pattern: str) -> Path:
    """The first committed GPU device's results folder that has records matching ``pattern``
    (devices may hold part of the grid); skips the test where none has."""
    for e2e in COMMITTED:
        if any(e2e.parent.glob(pattern)):
            return e2e.parent
    pytest.skip(f"no committed GPU device has records {pattern}")


def _table(text: str, after: str) -> pd.DataFrame:
    """The first markdown table following the line that contains `after`."""
    lines = text[text.index(after) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return pd.DataFrame(rows[2:], columns=rows[0])


def _nsys_frame(root: Path) -> pd.DataFrame:
    """The nsys report's frame of a device's committed records (its fp32 e2e records beside)."""
    return nsys_report.frame(load((root / "nsys").glob("*.json")), load((root / "e2e").glob("*_fp32_eager_w5.json")))


def _percent(cell: str) -> float:
    """A table's percentage; NaN for a cell without a value (— : not measured)."""
    try:
        return float(cell.rstrip("%"))
    except ValueError:
        return float("nan")


@needs_records
def test_e2e_variability_sentence_agrees_with_table():
    kind = device_with("e2e/*_eager_w5.json") / "e2e"
    df = e2e_report.frame(load(kind.glob("*.json")))
    text = e2e_report.section_benchmarking_script(df, 5, kind.parent.name)
    table = _table(text, "### (b)")
    clause = text.split("above it only for ")[1].split("%). ")[0] + "%)"
    cited = re.findall(r"([\w.]+)/(\d+) \(([\d.]+)%\)", clause)
    assert cited
    for model, ctx, cv in cited:
        row = table[(table.model == model) & (table.context == ctx)].iloc[0]
        assert float(cv) == pytest.approx(max(_percent(row["fwd CV"]), _percent(row["bwd CV"])), abs=0.05)
        assert float(cv) >= 100 * e2e_report.LOW_CV
    cvs = [max(_percent(r["fwd CV"]), _percent(r["bwd CV"])) for _, r in table.iterrows()]
    measured = [cv for cv in cvs if cv == cv]  # rows of cells not measured have no CV
    steady = [cv for cv in measured if cv < 100 * e2e_report.LOW_CV]
    assert f"in {len(steady)} of {len(measured)} cells" in text


@needs_records
def test_memory_sections_agree_with_tables():
    kind = device_with("memory/*.json") / "memory"
    records = load(kind.glob("*.json"))
    df = memory_report.frame(records)
    text = memory_report.section_b(df, records)
    table = _table(text, "### (b)")
    gap, ctx = re.search(r"largest gap, ([\d.]+) GiB \(fp32, context (\d+)", text).groups()
    row = table[table.context == ctx].iloc[0]
    assert float(gap) == pytest.approx(float(row["full step (GiB)"]) - float(row["full step, replay (GiB)"]), abs=0.011)
    a = memory_report.section_a(records, kind.parent.name)
    stages = _table(a, "What each stage does")
    training = stages[stages["mode"] == "training"]
    visible = (training["every stage visible"] == "yes").sum()
    assert f"in {visible} of {len(training)} training cells" in a
    c = memory_report.section_c(df, records)
    change = _table(c, "Peak change from fp32 to bf16")
    inference = change[change["mode"] == "inference"]
    lo, hi = re.search(r"Inference: bf16 changes the peak by ([-+\d.]+)% to ([-+\d.]+)%", c).groups()
    values = [_percent(v) for v in inference.change]
    assert (float(lo), float(hi)) == pytest.approx((min(values), max(values)), abs=0.051)


@needs_records
def test_committed_nsys_tables_show_short_kernel_names_each_in_the_legend():
    """nsys (b) on every committed GPU device: no kernel name in its tables longer than SHORT_NAME_CHARS,
    no cuBLAS/CUTLASS template name in full, each shortened one in the legend, and no two kernels under one
    short name."""
    for e2e in COMMITTED:
        if not any((e2e.parent / "nsys").glob("*.json")):
            continue
        text = nsys_report.section_b(_nsys_frame(e2e.parent))
        rows = [line for line in text.splitlines() if line.startswith("|")]
        names = {n for line in rows for n in re.findall(r"`([^`]+)`", line)}
        assert names, e2e.parent.name
        assert max(map(len, names)) <= nsys_report.SHORT_NAME_CHARS, sorted(names, key=len)[-1]
        # cuBLAS/CUTLASS template names (nvjet_…, …xmma_gemm_…, cutlass_…) only by their short names
        assert not [n for n in names if re.search(r"nvjet_|xmma_|cutlass_", n)]
        legend = text.split("Kernel names in full:", 1)[1] if "Kernel names in full:" in text else ""
        assert "one short name for these" not in legend
        for short in re.findall(r"^- `([^`]+)`:", legend, re.M):
            assert short in names or short in text.split("Kernel names in full:", 1)[0]
        for name in names:
            if name.startswith(("xmma ", "nvjet ", "cutlass ")):
                assert f"- `{name}`: `" in legend, name


@needs_records
def test_nsys_softmax_sentence_agrees_with_table():
    kind = device_with("nsys/*.json")
    df = _nsys_frame(kind)
    text = nsys_report.section_d(df)
    table = _table(text, "### (d)")
    shares = [_percent(v) for v in table["attention softmax (its NVTX range), inference"]]
    median, lo, hi = re.search(r"attention softmax takes ([\d.]+) \(range ([\d.]+)–([\d.]+)\)%", text).groups()
    assert (float(lo), float(hi)) == pytest.approx((min(shares), max(shares)), abs=0.06)
    assert float(median) == pytest.approx(pd.Series(shares).median(), abs=0.06)


@needs_records
def test_attention_oom_sentence_agrees_with_record():
    kind = device_with("attention/*.json") / "attention"
    records = load(kind.glob("*.json"))
    df = attention_report.frame(records)
    text = attention_report.oom_accounting(df)
    oom = df[(df.implementation == "plain") & (df.status == "oom")].sort_values(["sequence_length", "head_dim"])
    if oom.empty:
        pytest.skip("no plain cell ran out of memory")
    reserved = attention_report.reserved_unallocated_mib(oom.iloc[0].oom_message)
    assert f"{reserved / 1024:.2f} GiB reserved by PyTorch but unallocated" in text


def _memory_frame(fixed_share: float) -> pd.DataFrame:
    rows = []
    for precision, peak in (("fp32", 1000.0), ("bf16", 1000.0)):
        rows.append(
            {
                "model": "tiny",
                "context_length": 32,
                "precision": precision,
                "mode": "inference",
                "status": "ok",
                "peak_allocated_mib": peak,
                "analytic_parameters_mib": fixed_share * peak,
                "analytic_gradients_mib": None,
                "analytic_optimizer_state_mib": None,
                "analytic_activations_mib": 1.0,
                "analytic_weight_copies_mib": 0.5,
            }
        )
    return pd.DataFrame(rows)


def test_dominates_flips_at_dominant_share():
    share = memory_report.DOMINANT_SHARE
    above = memory_report.section_c(_memory_frame(share * 1.2), [])
    below = memory_report.section_c(_memory_frame(share * 0.8), [])
    assert "and dominate it" in above and "do not dominate" not in above
    assert "do not dominate it" in below


def _bf16_frame(speedup: float) -> pd.DataFrame:
    rows = []
    for precision, ms in (("fp32", 100.0), ("bf16", 100.0 / speedup)):
        for ctx in (128, 256):
            rows.append(
                {
                    "model": "xl",
                    "context_length": ctx,
                    "precision": precision,
                    "compile": "eager",
                    "warmup_steps": 5,
                    "forward_ms_mean": ms,
                    "backward_ms_mean": 2 * ms,
                    "training_step_ms_mean": 3 * ms,
                }
            )
    return pd.DataFrame(rows)


def test_pays_off_flips_at_payoff_speedup():
    pays = e2e_report.section_mixed_precision(_bf16_frame(e2e_report.PAYOFF_SPEEDUP * 1.1), 5)
    not_yet = e2e_report.section_mixed_precision(_bf16_frame(e2e_report.PAYOFF_SPEEDUP * 0.9), 5)
    assert "bf16 pays off" in pays and "`PAYOFF_SPEEDUP`" in pays
    assert "bf16 pays off" not in not_yet and "At no size" in not_yet


def test_bf16_on_a_cpu_is_explained_in_cpu_words_with_its_measured_range():
    """A CPU's bf16 slowdown (about 0.1x where its matmuls have no native bf16) is counted and explained,
    not presented bare, and not in GPU words."""
    slow = e2e_report.section_mixed_precision(_bf16_frame(0.1), 5, "cpu")
    assert "runs at 0.10× fp32's speed over 2 cells: slower in 2, faster in 0, within 3% of fp32" in slow
    assert "slow fallback path" in slow and "speed_ladder's measured square-GEMM ceilings" in slow
    assert "say nothing about what bf16 gains on a GPU" in slow
    for gpu_words in ("tensor core", "kernel", "launch", "HBM", "CUDA"):
        assert gpu_words not in slow, gpu_words
    same = e2e_report.section_mixed_precision(_bf16_frame(1 + e2e_report.SAME / 2), 5, "cpu")
    assert "slower in 0, faster in 0, within 3% of fp32 (`SAME`, about as fast) in 2" in same
    gpu = e2e_report.section_mixed_precision(_bf16_frame(2.0), 5, "h100")
    assert "Training-step speedup from bf16, by size" in gpu and "slow fallback path" not in gpu


def _attention_cell(attention: str, device: str, step_ms: float, peak_mib: float | None) -> dict:
    metrics = {"training_step_ms_median": step_ms, "inference_forward_ms_median": step_ms / 3}
    if peak_mib is not None:
        metrics["training_peak_allocated_mib"] = peak_mib
    return {
        "cell": {"model": "tiny", "context_length": 32, "precision": "fp32", "compile": "eager", "warmup_steps": 2},
        "status": "ok",
        "metrics": metrics,
        "provenance": {"device_slug": device, "settings": {"attention": attention}},
    }


def test_attention_in_the_model_has_no_blank_peak_columns_on_a_cpu():
    cpu = e2e_report.section_attention_in_model(
        [_attention_cell("plain", "cpu", 30.0, None), _attention_cell("sdpa", "cpu", 24.0, None)]
    )
    header = next(line for line in cpu.splitlines() if line.startswith("| model"))
    assert "peak" not in header and "training step / plain's" in header
    assert "which a CPU run does not have" in cpu and "With `sdpa` a training step takes 0.80× plain's time" in cpu
    gpu = e2e_report.section_attention_in_model(
        [_attention_cell("plain", "h100", 30.0, 1000.0), _attention_cell("sdpa", "h100", 24.0, 500.0)]
    )
    assert "| training peak (MiB) |" in re.sub(r" +", " ", gpu) and "at 0.50× its peak memory" in gpu
    assert "No peak memory columns" not in gpu


def test_head_dim_barely_matters_flips_at_threshold():
    def df(ratio):
        return pd.DataFrame(
            [
                {
                    "implementation": "plain",
                    "status": "ok",
                    "head_dim": d,
                    "sequence_length": 1024,
                    "retained_mib": 100.0 * (ratio if d == 128 else 1),
                }
                for d in (16, 128)
            ]
        )

    limit = attention_report.HEAD_DIM_MATTERS
    assert "barely matters" in attention_report._head_dim_effect(df(limit * 0.9), "plain")
    assert "barely matters" not in attention_report._head_dim_effect(df(limit * 1.1), "plain")


@needs_records
def test_torch_compile_sentence_agrees_with_table():
    kind = device_with("e2e/*_compiled_*.json") / "e2e"
    text = e2e_report.section_compile(e2e_report.frame(load(kind.glob("*.json"))), 5)
    table = _table(text, "### (b)")
    lo, hi = re.search(r"inference forward up ([\d.]+)×–([\d.]+)×", text).groups()
    speedups = table["fwd speedup"].astype(float)
    assert (float(lo), float(hi)) == pytest.approx((speedups.min(), speedups.max()), abs=0.006)
    for model in table.model.unique():
        assert f"{model} (context" in text


def test_launch_bound_compares_cells_of_one_warm_up_count():
    import pandas as pd

    from lmperf.kinds.e2e.report import LAUNCH_BOUND_GROWTH, launch_bound

    def cell(ctx, warmup, forward_ms):
        return dict(
            model="small",
            precision="fp32",
            compile="eager",
            context_length=ctx,
            warmup_steps=warmup,
            forward_ms_median=forward_ms,
        )

    # with 5 warm-up steps ctx 256 -> 512 grows 1.9x (not launch-bound); the w0 cell at 256 is slow
    # (its first steps), so comparing 512 against it would read as no growth at all
    df = pd.DataFrame([cell(256, 0, 40.0), cell(256, 5, 10.0), cell(512, 5, 19.0)])
    assert 19.0 / 40.0 < LAUNCH_BOUND_GROWTH < 19.0 / 10.0
    assert launch_bound(df, "small", 256, warmup_steps=5) is False
    assert launch_bound(df, "small", 256, warmup_steps=1) is None


def test_header_lists_agree_in_number():
    from lmperf.report.answers import missing_text, stale_text

    assert "(1 record: its code version differs" in stale_text(["results/h100/nsys/a.json"])[0]
    assert "re-measures it):" in stale_text(["results/h100/nsys/a.json"])[0]
    two = stale_text(["results/h100/nsys/a.json", "results/h100/nsys/b.json"])[0]
    assert "(2 records: their code version differs" in two and "re-measures them):" in two
    both = stale_text(["results/h100/nsys/a.json", "results/h100/scaleout/e2e.json"])[0]
    assert "`snakemake --cores 1 all` on this device re-measures it;" in both
    assert (
        "the scale-out check is not part of `all`" in both
        and "`snakemake --cores 4 scaleout --forcerun scaleout_cell --resources gpu=2`" in both
    )
    assert "(1 cell of the grid has no record" in missing_text(["results/h100/e2e/a.json"])[0]
    assert (
        "(2 cells of the grid have no record" in missing_text(["results/h100/e2e/a.json", "results/h100/e2e/b.json"])[0]
    )


def test_a_problem_names_its_own_records_of_older_code(tmp_path):
    from lmperf.report import answers

    assert set(answers.PROBLEM_RECORDS) == {problem for problem, _, _ in answers.PROBLEMS}
    stale = ["results/h200/e2e/small_ctx512_fp32_compiled_w5.json", "results/h200/nsys/small_ctx128_fp32_training.json"]
    compile_note = answers.older_code_note("torch_compile", stale)
    assert (
        "1 of the records this answer draws on was measured" in compile_note
        and "e2e (1): small_ctx512_fp32_compiled_w5" in compile_note
    )
    assert "nsys" not in compile_note
    assert answers.older_code_note("benchmarking_script", stale) is None  # eager cells only
    assert answers.older_code_note("memory_profiling", stale) is None
    nsys_note = answers.older_code_note("nsys_profile", stale)
    assert "nsys (1): small_ctx128_fp32_training" in nsys_note and "compiled" not in nsys_note
    # in the report, the note sits under its problem's heading and nowhere else
    text = answers.assemble("h200", tmp_path, [], stale=stale)
    compile_part = text.split("## torch_compile")[1].split("\n## ")[0]
    assert "**Older code here:**" in compile_part
    assert "**Older code here:**" not in text.split("## benchmarking_script")[1].split("\n## ")[0]


@needs_records
def test_nsys_non_matmul_sentence_lists_every_kernel_of_its_table():
    kind = device_with("nsys/*.json")
    records = load((kind / "nsys").glob("*.json"))
    df = nsys_report.frame(records, load((kind / "e2e").glob("*_fp32_eager_w5.json")))
    text = nsys_report.section_c(records, df)
    table = _table(text, "### (c)")
    listed = text.split("Those above", 1)[1].split(". Elementwise", 1)[0]
    assert len(table) == listed.count("`") // 2
    for kernel in table.kernel:
        assert f"`{kernel.strip('`')}` (" in listed


@needs_records
def test_warmup_sentences_say_also_only_after_a_first_case():
    for kind in sorted(Path("results").glob("*/e2e")):
        df = e2e_report.frame(load(kind.glob("*.json")))
        text = e2e_report.section_benchmarking_script(df, 5, kind.parent.name)
        assert "it is also higher" not in text
        if "the forward CV is also higher" in text:
            assert text.index("warm-up does not remove their noise") < text.index("the forward CV is also higher")


# -- layout: no stray blank lines in any fragment, on the committed GPU records ----------------------


def _report_argv(kind: str, results: Path, out: Path) -> list[str]:
    """The arguments the workflow gives kind's report CLI (workflow/rules/<kind>.smk), outputs under out."""

    def paths(pattern: str) -> list[str]:
        return sorted(map(str, results.glob(pattern)))

    records = paths(f"{kind}/*.json")
    extra = {
        "e2e": ["--default-warmup", "5", "--csv", str(out / "e2e.csv")],
        "memory": ["--csv", str(out / "m.csv"), "--top-csv", str(out / "t.csv"), "--reference-model", "2.7B"]
        + ["--batch-size", "4", "--reference-context-length", "512"],
        "nsys": ["--csv", str(out / "n.csv"), "--kernels-csv", str(out / "k.csv")]
        + ["--e2e-records", *paths("e2e/*_fp32_eager_w5.json")],
        "attention": ["--csv", str(out / "a.csv")],
        "precision": ["--tables-dir", str(out / "tables")],
        "flash": ["--tables-dir", str(out / "tables")],
        "ladder": ["--csv", str(out / "l.csv"), "--jobs"],
    }[kind]
    if kind == "ladder":
        records += paths("gemm_peak/*.json") + paths("ladder_profile/*.json")
    return [
        *("--device", results.name, "--sections-dir", str(out / "sections"), "--figures-dir", str(out / "f")),
        *extra,
        *("--records", *records),
    ]


def test_blocks_separate_by_exactly_one_blank_line():
    from lmperf.report.common import blocks

    table = "| a |\n|---|\n| 1 |\n"  # md_table's ending
    assert blocks("### (b) Head\ntext\n", table, "", "\nSentence.\n\n", "\n") == (
        "### (b) Head\ntext\n\n| a |\n|---|\n| 1 |\n\nSentence.\n"
    )
    assert blocks("", "\n") == "\n"


@needs_records
@pytest.mark.parametrize("kind", ["e2e", "memory", "nsys", "attention", "precision", "flash", "ladder"])
def test_fragments_have_no_stray_blank_lines(kind, tmp_path):
    import importlib

    results = device_with(f"{kind}/*.json")
    module = importlib.import_module(f"lmperf.report.{kind}")
    assert module.main(_report_argv(kind, results, tmp_path)) == 0
    fragments = sorted((tmp_path / "sections").glob("*.md"))
    assert fragments
    for path in fragments:
        text = path.read_text()
        assert "\n\n\n" not in text, f"{path.name}: two blank lines in a row at " + repr(
            text[max(0, text.index("\n\n\n") - 80) : text.index("\n\n\n") + 40]
        )
        assert text.endswith("\n") and not text.endswith("\n\n"), path.name
        lines = text.splitlines()
        for before, blank, after in zip(lines, lines[1:], lines[2:]):
            for start in ("|", "- "):
                assert not (before.startswith(start) and not blank and after.startswith(start)), (
                    f"{path.name}: a blank line inside a table or list, after {before[:60]!r}"
                )


def _inference_record(precision: str, peak: float) -> dict:
    return {
        "status": "ok",
        "cell": {"model": "tiny", "context_length": 32, "precision": precision, "mode": "inference"},
        "metrics": {"peak_allocated_mib": peak},
    }


def test_inference_peaks_are_close_only_under_close_peak_share():
    share = memory_report.CLOSE_PEAK_SHARE
    close = memory_report.close_peaks_clause(
        [_inference_record("fp32", 1000.0), _inference_record("bf16", 1000.0 * (1 + share / 2))]
    )
    far = memory_report.close_peaks_clause(
        [_inference_record("fp32", 1000.0), _inference_record("bf16", 1000.0 * (1 - share * 2))]
    )
    assert "are close: they differ by at most 2.5% (under 5%, `CLOSE_PEAK_SHARE`" in close
    assert "yet bf16 and fp32 inference peaks differ by up to 10.0% (5% or more" in far and "are close" not in far
    assert memory_report.close_peaks_clause([_inference_record("fp32", 1000.0)]) == ""  # no pair: no verdict


@needs_records
def test_memory_close_peaks_sentence_agrees_with_table_c():
    kind = device_with("memory/*.json") / "memory"
    records = load(kind.glob("*.json"))
    a = memory_report.section_a(records, kind.parent.name)
    change = _table(memory_report.section_c(memory_report.frame(records), records), "Peak change from fp32 to bf16")
    worst = max(abs(_percent(v)) for v in change[change["mode"] == "inference"].change)
    cited = re.search(r"differ by (?:at most|up to) ([\d.]+)%", a).group(1)
    assert float(cited) == pytest.approx(worst, abs=0.051)


def test_torch_compile_says_which_contexts_it_did_not_compile_and_prints_one_value_once():
    def row(ctx, compiled, ms):
        return {
            "model": "small",
            "context_length": ctx,
            "precision": "fp32",
            "compile": "compiled" if compiled else "eager",
            "warmup_steps": 5,
            "training_status": "ok",
            "inference_forward_ms_mean": ms,
            "training_step_ms_mean": 3 * ms,
        }

    df = pd.DataFrame([row(128, False, 10.0), row(256, False, 20.0), row(256, True, 10.0)])
    text = e2e_report.section_compile(df, 5)
    assert "forward up 2.00× and the full training step (forward, backward, AdamW) 2.00× over this cell." in text
    assert "2.00×–2.00×" not in text and "listed at the top of the report" not in text
    assert "Not compiled at context 128, which benchmarking_script (b) measures eager" in text
    df = pd.DataFrame([row(256, False, 20.0), row(256, True, 10.0)])
    assert "Not compiled" not in e2e_report.section_compile(df, 5)


def _compiled_pair(model, ctx, first_step_s, training_status="ok", cache_hits=None):
    """An eager and a compiled e2e row of one cell, the compiled one with its first step's wall time
    (and, as newer records have it, how often it hit torch.compile's on-disk caches)."""
    common = {"model": model, "context_length": ctx, "precision": "fp32", "warmup_steps": 5}
    eager = {**common, "compile": "eager", "training_status": training_status, "inference_status": "ok"}
    eager.update(inference_forward_ms_mean=20.0, training_step_ms_mean=60.0)
    compiled = {**common, "compile": "compiled", "training_status": training_status, "inference_status": "ok"}
    compiled.update(
        inference_forward_ms_mean=10.0,
        training_step_ms_mean=30.0,
        training_first_step_ms=first_step_s * 1e3,
        inference_first_forward_ms=first_step_s * 400.0,
        compile_cache_hits=cache_hits,
    )
    if training_status != "ok":
        for row in (eager, compiled):
            row["training_step_ms_mean"] = None
    return [eager, compiled]


def test_torch_compile_names_a_first_step_too_short_for_a_cold_compile_and_leaves_it_out_of_the_range():
    share = e2e_report.WARM_COMPILE_SHARE

    def text(suspect_s):
        rows = []
        for ctx, first_s in ((128, 80.0), (256, 72.0), (512, suspect_s), (1024, 70.0)):
            rows += _compiled_pair("large", ctx, first_s)
        return e2e_report.section_compile(pd.DataFrame(rows), 5)

    below = text(share * 72.0 * 0.9)  # the others' median is 72 s
    assert "large at context 512: its first training step took" in below
    assert "of the median of large's other compiled cells (72.00 s)" in below
    assert "wall time is 70.00 s–80.00 s for the training graph (forward and backward) of the other cells" in below
    above = text(share * 72.0 * 1.1)
    assert "large at context 512" not in above
    assert f"wall time is {share * 72.0 * 1.1:.2f} s–80.00 s for the training graph (forward and backward) and" in above


def test_torch_compile_takes_a_warm_or_cold_compile_from_the_records_cache_hits_when_it_has_them():
    def text(hits_at_512, first_s_at_512):
        rows = []
        for ctx, first_s, hits in ((128, 80.0, 0), (256, 72.0, 0), (512, first_s_at_512, hits_at_512), (1024, 70.0, 0)):
            rows += _compiled_pair("large", ctx, first_s, cache_hits=hits)
        return e2e_report.section_compile(pd.DataFrame(rows), 5)

    warm = text(6, 60.0)  # hits: warm, though its first step is not short
    assert "large at context 512: its record counts 6 hits of torch.compile's on-disk caches" in warm
    assert "wall time is 70.00 s–80.00 s for the training graph (forward and backward) of the other cells" in warm
    cold = text(0, 5.0)  # no hits: a cold compile, however short (no share heuristic)
    assert "large at context 512" not in cold
    assert "wall time is 5.00 s–80.00 s for the training graph (forward and backward) and" in cold
    assert "compile cache hits" not in _table(cold, "### (b)").columns  # not printed


def test_torch_compile_shows_no_first_step_for_a_cell_whose_compiled_training_ran_out_of_memory():
    rows = _compiled_pair("xl", 512, 120.0) + _compiled_pair("xl", 1024, 116.0, training_status="oom")
    text = e2e_report.section_compile(pd.DataFrame(rows), 5)
    table = _table(text, "### (b)")
    first = dict(zip(table.context.astype(int), table["first train step compiled (s)"]))
    assert first[512] == "120" and first[1024] in ("—", "")
    assert "wall time is 120 s for the training graph" in text
    assert "Compiled training runs out of memory at: xl/ctx 1024/fp32." in text
    assert "Not compiled" not in text  # 1024 was compiled; its training ran out of memory


def test_cpu_method_paragraphs_have_no_gpu_words():
    df = _e2e_rows(0.01, 2.0)
    assert "torch.cuda.synchronize()" in e2e_report.section_benchmarking_script(df, 7, "h100")
    cpu = e2e_report.section_benchmarking_script(df, 7, "cpu")
    assert "torch.cuda.synchronize()" not in cpu and "no device to synchronize with" in cpu
    settings = {
        "batch_size": 8,
        "precision": "fp32",
        "warmup_passes": 2,
        "measured_passes": 5,
        "max_phase_seconds": 1.0,
        "min_measured_passes": 2,
    }
    records = [{"provenance": {"settings": settings}}]
    gpu = attention_report.method_section(records, "h100")
    assert "GPU minutes" in gpu and "empty card" in gpu
    cpu = attention_report.method_section(records, "cpu")
    assert "GPU minutes" not in cpu and "CPU minutes" in cpu and "empty card" not in cpu


# -- more sections: the numbers their sentences cite against the tables they summarise ---------------


def _mean(cell: str) -> float:
    """The mean of a 'mean ± std' table cell."""
    return float(cell.split("±")[0].replace(",", ""))


def _cited_range(text: str, pattern: str) -> tuple[float, float]:
    lo, hi = re.search(pattern, text).groups()
    return float(lo.replace(",", "")), float(hi.replace(",", ""))


@needs_records
def test_backward_over_forward_sentence_agrees_with_table():
    kind = device_with("e2e/*_eager_w5.json") / "e2e"
    text = e2e_report.section_benchmarking_script(e2e_report.frame(load(kind.glob("*.json"))), 5, kind.parent.name)
    table = _table(text, "### (b)")
    fits = table[table.forward != "OOM"]
    ratios = [_mean(b) / _mean(f) for f, b in zip(fits.forward, fits.backward)]
    lo, hi = _cited_range(text, r"Backward takes ([\d.]+)× to ([\d.]+)× the forward time")
    # the table rounds times ≥ 100 ms to whole milliseconds: allow that rounding in the ratio
    assert lo == pytest.approx(min(ratios), rel=0.01) and hi == pytest.approx(max(ratios), rel=0.01)
    assert f"across the {len(fits)} configurations that fit" in text


@needs_records
def test_bf16_speedup_sentence_agrees_with_table():
    kind = device_with("e2e/*_bf16_eager_w5.json") / "e2e"
    text = e2e_report.section_mixed_precision(e2e_report.frame(load(kind.glob("*.json"))), 5, kind.parent.name)
    table = _table(text, "| model")
    table = table[table["step speedup"] != "—"]
    for model, group in table.groupby("model"):
        speed = group["step speedup"].astype(float)
        lo, hi = _cited_range(text, rf"[:;] {re.escape(model)} ([\d.]+)–([\d.]+)×")
        assert (lo, hi) == pytest.approx((speed.min(), speed.max()), abs=0.006)


@needs_records
def test_nsys_softmax_against_matmuls_sentence_agrees_with_table():
    kind = device_with("nsys/*.json")
    df = _nsys_frame(kind)
    text = nsys_report.section_e(df)
    table = _table(text, "### (e)")
    fp32 = table[table.precision == "fp32"]["softmax / matmuls, time"].astype(float)
    median, lo, hi = re.search(r"Softmax takes ([\d.]+) \(range ([\d.]+)–([\d.]+)\)×", text).groups()
    assert (float(lo), float(hi)) == pytest.approx((fp32.min(), fp32.max()), abs=0.006)
    assert float(median) == pytest.approx(fp32.median(), abs=0.011)
    assert f"({len(fp32)} fp32 cells)" in text


@needs_records
def test_attention_under_compile_sentence_agrees_with_table():
    kind = device_with("attention/*.json") / "attention"
    records = load(kind.glob("*.json"))
    text = attention_report.section_torch_compile(attention_report.frame(records), "fig")
    table = _table(text, "| ")
    for column, label in (("fwd speedup", "forward"), ("bwd speedup", "backward")):
        speed = pd.to_numeric(table[column], errors="coerce").dropna()
        lo, hi = _cited_range(text, rf"Compiled {label}: ([\d.]+)×–([\d.]+)× plain's speed")
        assert (lo, hi) == pytest.approx((speed.min(), speed.max()), abs=0.006)
        # the sentence counts unrounded speed-ups, the table shows them to 2 decimals: a table value
        # within rounding of a threshold (e.g. 0.97 for 0.9698) may count on either side of it
        rounding = 0.006
        faster = ((speed > 1 + SAME + rounding).sum(), (speed > 1 + SAME - rounding).sum())
        slower = ((speed < 1 - SAME - rounding).sum(), (speed < 1 - SAME + rounding).sum())
        cited = re.search(
            rf"Compiled {label}: .*?over (\d+) cells; faster in (\d+), slower in (\d+).*?"
            rf"within 3% of plain \(`SAME`, about as fast\) in (\d+)\.",
            text,
        )
        n, n_faster, n_slower, n_same = map(int, cited.groups())
        assert n == len(speed) and n_faster + n_slower + n_same == n
        assert faster[0] <= n_faster <= faster[1] and slower[0] <= n_slower <= slower[1]


@needs_records
def test_attention_matrices_kept_sentence_agrees_with_table():
    kind = device_with("attention/*.json") / "attention"
    text = attention_report.growth_section(attention_report.frame(load(kind.glob("*.json"))))
    table = _table(text, "| implementation")
    plain = float(table[table.implementation == "plain"]["N×N matrices kept"].iloc[0])
    cited = float(re.search(r"Plain attention keeps ([\d.]+) N×N matrices", text).group(1))
    assert cited == pytest.approx(plain, abs=0.006)


@needs_records
@pytest.mark.parametrize("problem", ["flash_forward", "flash_backward"])
def test_flash_largest_error_sentence_agrees_with_table(problem):
    from lmperf.kinds.flash import report as flash_report

    kind = device_with("flash/correctness_*.json") / "flash"
    records = load(kind.glob("correctness_*.json"))
    text = flash_report.section_correctness(problem, records, flash_report.correctness_frame(records), kind.parent.name)
    table = _table(text, "### Largest error against float64")
    errors = [c for c in table.columns if c.startswith("max ")]
    sentence = text.split("Largest relative error per precision — ", 1)[1].split("\n", 1)[0]
    for impl, group in table.groupby("implementation"):
        part = sentence.split(f"`{impl}`: ", 1)[1].split("; `", 1)[0]
        for _, row in group.iterrows():
            largest = max(float(row[c]) for c in errors)
            cited = float(re.search(rf"{row.precision} ([\d.e+-]+) \(", part).group(1))
            assert cited == pytest.approx(largest, rel=0.05), (impl, row.precision)


@needs_records
def test_leaderboard_sentences_agree_with_their_tables():
    from lmperf.kinds.flash import report as flash_report

    root = device_with("flash/*leaderboard*.json")
    records = load((root / "flash").glob("*leaderboard*.json"))
    text = flash_report.section_leaderboard(records, root.name)
    table = _table(text, "Protocol:").set_index("implementation")
    ms = {
        impl: float(table.loc[impl, "fwd+bwd median (ms)"]) for impl in table.index if table.loc[impl, "status"] == "ok"
    }
    ours = float(re.search(r"\*\*Ours \(flash_triton\): ([\d.]+) ms\*\*", text).group(1))
    assert ours == pytest.approx(ms["flash_triton"], abs=0.006)
    for impl, name in (("sdpa_flash", "flash"), ("sdpa_cudnn", "cuDNN")):
        cited_ms, ratio = re.search(rf"{name} ([\d.]+) ms \(ours/{name} = ([\d.]+)", text).groups()
        assert float(cited_ms) == pytest.approx(ms[impl], abs=0.006)
        assert float(ratio) == pytest.approx(ours / float(cited_ms), abs=0.002)
        verdict = "faster" if float(ratio) < 1 else "slower"
        assert f"ours/{name} = {ratio}: ours is {verdict})" in text
    eager = _table(text, "### Side by side, eager")
    cited_dims = re.findall(r"d = (\d+): our forward alone reaches ([\d.]+) TFLOP/s .*? against (.*?) TFLOP/s\.", text)
    assert sorted(d for d, _, _ in cited_dims) == sorted(set(eager.d))  # a sentence per head dim of the table
    for d, cited, others in cited_dims:
        rows = eager[eager.d == d].set_index("implementation")
        assert float(cited) == pytest.approx(float(rows.loc["flash_triton", "fwd TFLOP/s"]), rel=0.005)
        for impl, value in re.findall(r"(sdpa_\w+) ([\d.]+)", others):
            assert float(value) == pytest.approx(float(rows.loc[impl, "fwd TFLOP/s"]), rel=0.005)


# -- the rest of the sections: cited numbers against their tables, as committed and as built now -----
#
# Each test reads a section twice: the fragment committed under results/<device>/sections/ and the
# same section built now by the report code from that device's committed records. Both must cite
# what their tables show; a number the report printed is checked against the interval of values
# that its printed digits stand for.


def _committed_and_built(root: Path, fragment: str, built: str, heading: str = "") -> dict[str, str]:
    """The section as committed (root/sections/fragment, from `heading` on) and as built now."""
    committed = (root / "sections" / fragment).read_text()
    if heading:
        committed = committed[committed.index(heading) :]
    return {"committed": committed, "built": built}


def _interval(cell: str, digits: int = 2) -> tuple[float, float]:
    """The values a number printed by fmt(x, digits) stands for: fmt rounds to `digits` decimals
    below 100 and to whole numbers from 100 (tables may drop trailing zeros)."""
    value = float(cell.replace(",", ""))
    half = 0.5 if abs(value) >= 100 else 0.5 * 10**-digits
    return value - half, value + half


def _ratio(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] / b[1], a[1] / b[0]


def _cites(cited: str, intervals, how, digits: int = 2) -> bool:
    """Whether `cited` (printed by fmt(·, digits)) can be how(·) of values in `intervals`: min, max
    and median grow with every value, so the true how(·) lies between how(lows) and how(highs)."""
    lows, highs = zip(*intervals)
    lo, hi = _interval(cited, digits)
    return lo - 1e-9 <= how(highs) and how(lows) <= hi + 1e-9


def _same(cited: str, cell: str, digits: int = 2) -> bool:
    """Whether a number in a sentence and one in a table, both printed by fmt(·, digits), can be one value."""
    return _cites(cited, [_interval(cell, digits)], min)


def _spread_cited(text: str) -> tuple[str, str, str]:
    """(median, low, high) of a '1.08 (range 1.00–2.11)' spread; one value stands for all three."""
    median, lo, hi = re.fullmatch(r"([\d.,]+)(?: \(range ([\d.,]+)–([\d.,]+)\))?", text).groups()
    return median, lo or median, hi or median


def _assert_spread_cites(spread: str, values: list, what: tuple) -> None:
    """A cited '(median) (range low–high)' spread matches the median, least and most of `values`."""
    for cited, how in zip(_spread_cited(spread), (statistics.median, min, max)):
        assert _cites(cited, values, how), (*what, cited)


@needs_records
def test_warmup_sweep_sentences_agree_with_table():
    root = device_with("e2e/*_eager_w0.json")
    records = [r for r in load((root / "e2e").glob("*.json")) if e2e_report.attention_of(r) == "plain"]
    built = e2e_report.section_benchmarking_script(e2e_report.frame(records), 5, root.name)
    for source, section in _committed_and_built(root, "benchmarking_script.md", built, "### (c)").items():
        section = section[section.index("### (c)") :]
        table = _table(section, "### (c)")
        rows = {(r.model, int(r["warm-up"])): r for _, r in table.iterrows()}
        cited = re.findall(
            r"(\S+): with no warm-up the first forward takes ([\d.,]+)× the median and the forward CV is "
            r"([\d.]+)% \(mean ([\d.,]+) ms\) against ([\d.]+)% \(mean ([\d.,]+) ms\) after 5 warm-up steps"
            r"(?:; one warm-up step gives ([\d.]+)%)?\.",
            section,
        )
        # a sentence per model that has both ends of the sweep, in the table's order
        assert [c[0] for c in cited] == [m for m in table.model.unique() if (m, 0) in rows and (m, 5) in rows], source
        for model, first, cv0, mean0, cv5, mean5, cv1 in cited:
            w0, w5 = rows[model, 0], rows[model, 5]
            assert _same(first, w0["fwd 1st/median"]), (source, model)
            assert (cv0, cv5) == (w0["fwd CV"].rstrip("%"), w5["fwd CV"].rstrip("%")), (source, model)
            assert _same(mean0, w0["fwd mean (ms)"]), (source, model)
            assert _same(mean5, w5["fwd mean (ms)"]), (source, model)
            assert cv1 == (rows[model, 1]["fwd CV"].rstrip("%") if (model, 1) in rows else ""), (source, model)
        # the models said to be noisier after 5 warm-up steps than after fewer: the table's CVs agree
        fewer = sorted({w for _, w in rows if 0 < w < 5})
        said = {}
        for verdict, pattern in (
            ("noisier", r"For ([\w., ]+?) the forward CV after 5 warm-up steps is higher than after ([\d or]+) and"),
            (
                "negligible",
                r"For ([\w., ]+?) the forward CV is (?:also )?higher after 5 warm-up steps than after ([\d or]+),",
            ),
        ):
            match = re.search(pattern, section)
            if match:
                assert match.group(2) == " or ".join(map(str, fewer)), source
                said.update(dict.fromkeys(match.group(1).split(", "), verdict))
        for model in table.model.unique():
            if (model, 5) not in rows or not any((model, w) in rows for w in fewer):
                continue
            cv5 = _percent(rows[model, 5]["fwd CV"])
            others = [_percent(rows[model, w]["fwd CV"]) for w in fewer if (model, w) in rows]
            if model in said:  # higher than every shorter warm-up (the table's rounding may tie them)
                assert all(cv5 >= cv for cv in others), (source, model)
                low = 100 * e2e_report.LOW_CV
                assert cv5 >= low if said[model] == "noisier" else cv5 <= low, (source, model)
            else:  # not higher than every one of them
                assert any(cv >= cv5 for cv in others), (source, model)


@needs_records
def test_nsys_forward_sentences_agree_with_table_a():
    root = device_with("nsys/*.json")
    built = nsys_report.section_a(_nsys_frame(root))
    for source, section in _committed_and_built(root, "nsys_profile.md", built, "### (a)").items():
        section = section.split("\n### (b)")[0]
        table = _table(section, "### (a)")
        timer = [_interval(v) for v in table["profiler / timer"]]
        busy = [
            _ratio(_interval(k), _interval(p)) for k, p in zip(table["kernel sum (ms)"], table["profiler fwd (ms)"])
        ]
        spread, cells, verdict, busy_cited = re.search(
            r"The profiler's forward time is (.+?)× the timer's in the same process over (\d+) cells?: (.+?)\. "
            r"The GPU is busy \(sum of kernel times\) for (.+?)× of that time",
            section,
        ).groups()
        assert int(cells) == len(table), source
        _assert_spread_cites(spread, timer, (source, "profiler / timer"))
        _assert_spread_cites(busy_cited, busy, (source, "kernel sum / profiler"))
        # |profiler / timer - 1| in percent, per cell: the least and the most its printed ratio allows
        off = [(100 * max(lo - 1, 1 - hi, 0), 100 * max(hi - 1, 1 - lo)) for lo, hi in timer]
        if verdict.startswith("they agree within"):
            assert all(least <= 100 * nsys_report.AGREE for least, _ in off), source
        else:
            cited = re.fullmatch(r"they differ by up to ([\d.]+)%", verdict).group(1)
            assert _cites(cited, off, max, digits=1), source
        # against the end-to-end records: all cells with an e2e time, then those the profiler slowed
        e2e = table[table["profiler / e2e"] != "—"]
        over_e2e = [_interval(v) for v in e2e["profiler / e2e"]]
        n, spread = re.search(
            r"Against the end-to-end records' inference forward \((\d+) cells?\) the profiled forward is (.+?)×\.",
            section,
        ).groups()
        assert int(n) == len(e2e), source
        _assert_spread_cites(spread, over_e2e, (source, "profiler / e2e"))
        slow = [lo > 1 + nsys_report.AGREE for lo, _ in over_e2e]
        maybe = [hi > 1 + nsys_report.AGREE for _, hi in over_e2e]  # the table's rounding cannot tell
        match = re.search(
            r"Where it is slower \((\d+) cells?\), the kernels alone take (.+?)× the unprofiled forward, .*?"
            r"\(median ratio by size: (.+?)\)\.",
            section,
        )
        if not any(maybe):
            assert match is None and "profiling did not slow the forward down" in section, source
            continue
        n, spread, by_size = match.groups()
        assert sum(slow) <= int(n) <= sum(maybe), source
        if slow != maybe:
            continue  # which cells are slower is not decidable from the printed ratios
        rows = e2e[slow]
        kernels = [_ratio(_interval(k), _interval(e)) for k, e in zip(rows["kernel sum (ms)"], rows["e2e fwd (ms)"])]
        _assert_spread_cites(spread, kernels, (source, "kernel sum / e2e"))
        cited = re.findall(r"(\S+) ([\d.]+)×", by_size)
        assert [m for m, _ in cited] == list(rows.model.unique()), source
        for model, value in cited:
            ratios = [_interval(v) for v in rows[rows.model == model]["profiler / e2e"]]
            assert _cites(value, ratios, statistics.median), (source, model)


def _significant(cell: str, digits: int) -> tuple[float, float]:
    """The values a number printed with `digits` significant digits ('%.{digits}g') stands for."""
    value = float(cell)
    half = 0.5 * 10 ** (math.floor(math.log10(abs(value))) - digits + 1)
    return value - half, value + half


def _check_accumulation(section: str, source: str) -> None:
    table = _table(section, "exact answer").set_index("loop")
    row = {loop.strip("`"): r for loop, r in table.iterrows()}
    steps = int(re.search(r"accumulator (\d+) times", section).group(1))
    a = row["fp32 += fp32"]
    result, stored, n, spacing, near, error = re.search(
        r"\*\*fp32 \+= fp32\*\* gives (\S+): .*? stored as (\S+), and each of the (\d+) additions rounds the sum "
        r"to fp32's spacing \((\S+) near (\d+)\); the rounding errors add up to (\S+)\.",
        section,
    ).groups()
    assert (result, stored, spacing, error) == (
        a["result"],
        a["0.01 as stored"],
        a["accumulator spacing at result"],
        a["error vs exact"],
    ), source
    assert int(n) == steps and int(near) == round(float(a["result"])), source
    b = row["fp16 += fp16"]
    result, error, times, spacing, share = re.search(
        r"\*\*fp16 \+= fp16\*\* gives (\S+) \(error (\S+), (\d+)× fp32's\): .*? the accumulator's spacing is "
        r"(\S+), ([\d.]+)× the increment itself",
        section,
    ).groups()
    assert (result, error, spacing) == (b["result"], b["error vs exact"], b["accumulator spacing at result"]), source
    errors = _ratio(_significant(b["error vs exact"], 3), _significant(a["error vs exact"], 3))
    assert errors[0] - 0.5 <= int(times) <= errors[1] + 0.5, source
    grid = _ratio(_significant(b["accumulator spacing at result"], 3), _significant(b["0.01 as stored"], 10))
    assert _cites(share, [grid], min), source
    c, d = row["fp32 += fp16"], row["fp32 += fp16 cast to fp32"]
    first, second, identical, stored, total, error = re.search(
        r"\*\*fp32 \+= fp16\*\* and \*\*fp32 \+= fp16 cast to fp32\*\* give (\S+) and (\S+?)( — identical,.*?)?\. "
        r"The fp32 accumulator is accurate: .*? \((\S+)\) is (\S+), and the remaining error \((\S+)\)",
        section,
    ).groups()
    cells = (c["result"], d["result"], c["0.01 as stored"], c["error vs exact"])
    assert (first, second, stored, error) == cells, source
    assert bool(identical) == (c["result"] == d["result"]), source
    lo, hi = _significant(stored, 10)
    assert steps * lo - 1e-9 <= float(total) <= steps * hi + 1e-9, source  # the sum of `steps` stored increments


@needs_records
def test_accumulation_sentences_agree_with_table():
    root = device_with("precision/accumulation.json")
    (record,) = load([root / "precision" / "accumulation.json"])
    built = precision_report.section_accumulation(record)
    for source, section in _committed_and_built(root, "mixed_precision_accumulation.md", built).items():
        _check_accumulation(section, source)
    # the other branch: the explicit cast giving another sum than the in-place add
    other = copy.deepcopy(record)
    cast = next(r for r in other["metrics"]["results"] if r["variant"] == "fp32 += fp16 cast to fp32")
    cast["result"] += 1e-6
    text = precision_report.section_accumulation(other)
    _check_accumulation(text, "cast differs")
    assert "identical" not in text


_TOY_SENTENCE = re.compile(
    r"Under (\w+) autocast the parameters stay (.+?) \(autocast casts.*?\); fc1's output is (\S+) "
    r"\(matmuls run in \1\); the layer norm's output is (\S+) — (layer_norm is on autocast's fp32 list"
    r"|this device's autocast does not put layer_norm on its fp32 list, so it runs in (\S+)).*?; the logits are "
    r"(\S+) \(fc2 is a matmul again\); the loss is (\S+?)( \(cross-entropy is on the fp32 list\))?; the "
    r"gradients are (.+?), the dtype"
)


def _check_toy(section: str, source: str) -> None:
    table = _table(section, "Measured on").set_index("tensor")
    cited = {m.group(1): m for m in _TOY_SENTENCE.finditer(section)}
    unsupported = set(re.findall(r"(\w+) autocast is not supported on `\w+` here", section))
    for column in table.columns:
        dtype = column.removesuffix(" autocast")
        if set(table[column]) == {"unsupported"}:
            assert dtype not in cited and dtype in unsupported, source
            continue
        assert dtype not in unsupported, source
        m = cited[dtype]
        want = table[column]
        assert m.group(2) == want["the model's parameters (inside autocast)"], (source, dtype)
        assert m.group(3) == want["output of fc1"], (source, dtype)
        assert m.group(4) == want["output of the layer norm"], (source, dtype)
        fp32_list = m.group(5).startswith("layer_norm is on")
        assert fp32_list == (m.group(4) == "fp32") and m.group(6) in (None, m.group(4)), (source, dtype)
        assert m.group(7) == want["predicted logits (fc2)"], (source, dtype)
        assert m.group(8) == want["loss (cross-entropy)"], (source, dtype)
        assert bool(m.group(9)) == (m.group(8) == "fp32"), (source, dtype)
        assert m.group(10) == want["gradients"], (source, dtype)


@needs_records
def test_autocast_dtype_sentences_agree_with_table():
    root = device_with("precision/toy_model.json")
    (record,) = load([root / "precision" / "toy_model.json"])
    built = precision_report.section_toy(record)
    for source, section in _committed_and_built(root, "benchmarking_mixed_precision_ab.md", built).items():
        _check_toy(section.split("\n### (b)")[0], source)
    # every tensor its own dtype, so a sentence citing the wrong row cannot agree by chance
    other = copy.deepcopy(record)
    entry = other["metrics"]["autocast"]["bf16"]
    entry.update(
        parameters={"w": "fp64"}, fc1_output="fp8", ln_output="bf16", logits="fp16", loss="int8", gradients={"w": "x"}
    )
    other["metrics"]["autocast"]["fp16"] = {"status": "unsupported", "reason": "not here"}
    text = precision_report.section_toy(other)
    assert "so it runs in bf16" in text
    _check_toy(text, "synthetic")


@needs_records
def test_residual_stream_sentences_agree_with_table_d():
    root = device_with("memory/*.json")
    records = load((root / "memory").glob("*.json"))
    model, batch, ctx = "2.7B", 4, 512  # as the workflow asks (workflow/rules/memory.smk, config.yaml)
    others = sorted({r["cell"]["context_length"] for r in records if r["cell"]["model"] == model} - {ctx})
    built = memory_report.section_d(records, model, batch, ctx, others)
    for source, section in _committed_and_built(root, "memory_profiling.md", built, "### (d)").items():
        section = section.split("\n### (e)")[0]
        table = _table(section, "Allocations of exactly")
        size = {int(c): int(b.replace(",", "")) for c, b in zip(table.context, table["size (bytes)"])}
        d_model = int(re.search(r"\(d_model = (\d+)\)", section).group(1))
        b, t, d, nbytes, again, mib = re.search(
            r"(\d+) · (\d+) · (\d+) · 4 bytes = ([\d,]+) bytes; ([\d,]+) / 1024² = \*\*([\d.]+) MiB\*\*", section
        ).groups()
        nbytes = int(nbytes.replace(",", ""))
        assert (int(b), int(t), int(d)) == (batch, ctx, d_model), source
        assert nbytes == batch * ctx * d_model * 4 == int(again.replace(",", "")) == size[ctx], source
        assert float(mib) == nbytes / 2**20, source
        cited = re.search(r"At the other profiled lengths \(same batch\): (.+?)\.\n", section).group(1)
        lengths = dict(re.findall(r"(\d+): ([\d.]+) MiB", cited))
        assert {int(c) for c in lengths} | {ctx} == set(size), source
        for c, value in lengths.items():
            assert float(value) == size[int(c)] / 2**20, (source, c)
        count, exact, site = re.search(
            rf"At context {ctx} the snapshot holds (\d+) allocations of exactly ([\d,]+) bytes "
            r"\(most common site: `(.+?)`\), confirming the derivation\.",
            section,
        ).groups()
        at_ctx = table[table.context == str(ctx)]
        counts = at_ctx["allocations of exactly that size"].astype(int)
        assert int(count) == counts.max() and int(exact.replace(",", "")) == nbytes, source
        assert site in set(at_ctx[counts == counts.max()]["most common site"]), source


def _check_largest(section: str, source: str) -> None:
    blocks = re.split(r"\n(?=\*\*(?:Training|Inference), )", section)[1:]
    assert blocks, source
    for block in blocks:
        table = _table(block, "**")
        n, sizes, kinds, lines = re.search(
            r"The (?:(\d+) largest are|largest is a) ([\d., ]+) MiB tensors?: (.+?)(?:; innermost model lines: (.+?))?\.\n",
            block,
        ).groups()
        assert int(n or 1) == len(table), (source, block[:40])
        cited = [float(s) for s in sizes.split(", ")]
        shown = sorted({float(v) for v in table["size (MiB)"]}, reverse=True)
        assert cited == pytest.approx(shown, abs=0.006), (source, block[:40])
        counts = {}
        for what in table.what:
            kind = "other" if what == "—" else what.split(":")[0].replace("_", " ")
            counts[kind] = counts.get(kind, 0) + 1
        assert {k: int(c) for c, k in re.findall(r"(\d+) ([\w ]+)", kinds)} == counts, (source, block[:40])
        innermost = {re.match(r"`([^`]+)`", f).group(1) for f in table.frames if f != "(none)"}
        assert set(re.findall(r"`([^`]+)`", lines or "")) == innermost, (source, block[:40])


@needs_records
def test_largest_allocation_sentences_agree_with_tables_e():
    root = device_with("memory/*.json")
    records = load((root / "memory").glob("*.json"))
    built = memory_report.section_e(records)
    for source, section in _committed_and_built(root, "memory_profiling.md", built, "### (e)").items():
        _check_largest(section, source)
    # three allocations listed, of three kinds, then one: the sentence follows the table
    record = copy.deepcopy(next(r for r in records if r["metrics"].get("top_allocations")))
    tops = record["metrics"]["top_allocations"][:3]
    for a, (category, name) in zip(tops, (("optimizer_state", "w.exp_avg"), ("gradients", "w"), (None, None))):
        a.update(category=category, name=name)
    record["metrics"]["top_allocations"] = tops
    _check_largest(memory_report.section_e([record]), "three allocations")
    record["metrics"]["top_allocations"] = tops[:1]
    _check_largest(memory_report.section_e([record]), "one allocation")


def _times(cell: str) -> list[tuple[float, float]] | None:
    """The (forward, backward, forward+backward) of a benchmark table cell, printed by fmt(·, 3)."""
    if cell in ("—", "n/a") or cell.startswith("OOM"):
        return None
    return [_interval(t, 3) for t in cell.split(" / ")]


@functools.cache
def _flash_benchmarking(root: Path) -> str:
    """flash_benchmarking as the code builds it now from root's benchmark records (built once)."""
    from lmperf.kinds.flash import report as flash_report

    records = flash_report.split(load((root / "flash").glob("*.json")))["benchmark"]
    return flash_report.section_benchmarking(records, flash_report.bench_frame(records), root.name, "fig")


@needs_records
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_flash_benchmark_sentences_agree_with_table(precision):
    root = device_with(f"flash/bench_*_{precision}_*.json")
    for source, text in _committed_and_built(root, "flash_benchmarking.md", _flash_benchmarking(root)).items():
        batch = int(re.search(r"Q, K, V of shape \((\d+), N, d\)", text).group(1))
        section = re.search(rf"\n### {precision}\b.*?(?=\n### |\n!\[)", text, re.S).group(0)
        table = _table(section, f"### {precision}")
        column = {c.split(" ")[0]: c for c in table.columns if c.endswith("fwd / bwd / fwd+bwd (ms)")}
        times = {impl: [_times(v) for v in table[c]] for impl, c in column.items()}
        shapes = list(zip(table.d, table.N))
        sentences = section.strip().split("\n")[-1]

        # forward+backward and forward alone against plain: the speed-up column, and the times it divides
        speed = table["flash_triton speed-up vs plain (fwd+bwd)"]
        both = [i for i, v in enumerate(speed) if v != "—"]
        fb = [_interval(speed[i]) for i in both]
        fwd = [_ratio(times["plain"][i][0], times["flash_triton"][i][0]) for i in both]
        match = re.search(
            r"flash_triton against plain: ([\d.,]+)× to ([\d.,]+)× plain's speed \(median ([\d.,]+)×\) over the "
            r"(\d+) shapes where both ran; largest at d = (\d+), N = (\d+), smallest at d = (\d+), N = (\d+); "
            r"faster in (\d+) of them\. Forward alone: ([\d.,]+)× to ([\d.,]+)× \(median ([\d.,]+)×\)\.",
            sentences,
        )
        lo, hi, median, n, d_hi, n_hi, d_lo, n_lo, faster, flo, fhi, fmedian = match.groups()
        assert int(n) == len(both), source
        for cited, values in ((lo, fb), (flo, fwd)):
            assert _cites(cited, values, min), (source, cited)
        for cited, values in ((hi, fb), (fhi, fwd)):
            assert _cites(cited, values, max), (source, cited)
        for cited, values in ((median, fb), (fmedian, fwd)):
            assert _cites(cited, values, statistics.median), (source, cited)
        shown = {shapes[i]: float(speed[i].replace(",", "")) for i in both}
        assert shown[d_hi, n_hi] == max(shown.values()) and shown[d_lo, n_lo] == min(shown.values()), source
        assert sum(lo > 1 for lo, _ in fb) <= int(faster) <= sum(hi > 1 for _, hi in fb), source

        # where plain first ran out of memory, and how far flash_triton ran
        cited = re.findall(r"N = (\d+) for d = (\d+) \(flash_triton ran up to N = (\d+)", sentences)
        plain_oom = {}
        for (d, n), cell in zip(shapes, table[column["plain"]]):
            if cell.startswith("OOM"):
                plain_oom.setdefault(d, n)
        assert [(d, n) for n, d, _ in cited] == list(plain_oom.items()), source
        for _, d, longest in cited:
            ran = [int(n) for (dd, n), t in zip(shapes, times["flash_triton"]) if dd == d and t is not None]
            assert int(longest) == max(ran), (source, d)

        # against each sdpa backend: the time-ratio column, and the forward times it leaves out
        for impl in [i for i in column if i not in ("plain", "flash_triton")]:
            label = column[impl].removesuffix(" fwd / bwd / fwd+bwd (ms)")
            lo, hi, median, fmedian, faster, n = re.search(
                rf"Against {re.escape(label)}: flash_triton's forward\+backward time is ([\d.,]+)× to ([\d.,]+)× its "
                r"time \(median ([\d.,]+)×; forward alone median ([\d.,]+)×\); ours is faster \(ratio below 1\) in "
                r"(\d+) of (\d+) shapes\.",
                sentences,
            ).groups()
            ratio = table[f"flash_triton / {impl} time (fwd+bwd)"]
            ran = [i for i, v in enumerate(ratio) if v != "—"]
            values = [_interval(ratio[i]) for i in ran]
            assert int(n) == len(ran), (source, impl)
            for cited, how in ((lo, min), (hi, max), (median, statistics.median)):
                assert _cites(cited, values, how), (source, impl, cited)
            assert sum(hi < 1 for _, hi in values) <= int(faster) <= sum(lo < 1 for lo, _ in values), (source, impl)
            forward = [_ratio(times["flash_triton"][i][0], times[impl][i][0]) for i in ran]
            assert _cites(fmedian, forward, statistics.median), (source, impl)

        # the best throughput, from the table's times: a causal forward does 4·B·N²·d/2 FLOPs, backward 2.5×
        tflops, d_best, n_best, fb_best = re.search(
            r"Highest flash_triton forward throughput: ([\d.,]+) TFLOP/s \(d = (\d+), N = (\d+)\); "
            r"forward\+backward ([\d.,]+) TFLOP/s at best\.",
            sentences,
        ).groups()
        forward_tf, total_tf = {}, {}
        for (d, n), t in zip(shapes, times["flash_triton"]):
            if t is not None:
                flops = 4 * batch * int(n) ** 2 * int(d) / 2 / 1e9  # per ms: TFLOP/s
                forward_tf[d, n] = (flops / t[0][1], flops / t[0][0])
                total_tf[d, n] = (3.5 * flops / t[2][1], 3.5 * flops / t[2][0])
        assert _cites(tflops, forward_tf.values(), max, digits=1), source
        assert _cites(tflops, [forward_tf[d_best, n_best]], max, digits=1), source
        assert _cites(fb_best, total_tf.values(), max, digits=1), source


def test_torch_compile_says_what_the_compiled_cells_compiled_from_their_records():
    def text(scopes):
        rows = []
        for ctx, scope in zip((128, 256, 512), scopes):
            eager, compiled = _compiled_pair("large", ctx, 10.0)
            rows += [{**eager, "compile_scope": None}, {**compiled, "compile_scope": scope}]
        return e2e_report.section_compile(pd.DataFrame(rows), 5)

    blocks = text(["blocks"] * 3)
    assert "The compiled cells compile the model block by block" in blocks and "as one graph" not in blocks
    whole = text(["model"] * 3)
    assert "The compiled cells compile the model as one graph" in whole and "block by block" not in whole
    mixed = text(["blocks", "model", "model"])
    assert "differ in how they compiled the model: 2 of 3 as one graph" in mixed and "1 of 3 block by block" in mixed
    assert "Block by block is `torch.compile` of each Transformer block" in mixed
    assert "Block by block is" not in whole
