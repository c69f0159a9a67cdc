"""The ladder's report: sentences flip with the numbers, the largest gain is named, files are written."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from lmperf.core.record import make_record, write_record
from lmperf.core.sizes import config_from_name
from lmperf.kinds.ladder import cell, report

PROV = {
    "device_slug": "h100",
    "device_name": "NVIDIA H100 80GB HBM3",
    "torch_version": "2.11",
    "git_commit": "abc",
    "git_dirty": False,
    "start_time": "2026-11-22T00:00:00+00:00",
    "settings": {},
}
GEMM = {"fp32_tflops": 50.0, "tf32_tflops": 370.0, "bf16_tflops": 750.0}


def rung_record(model, rung, index, parent, ms, status="ok", ctx=1024, batch=4, accum=1, **config):
    """A synthetic ladder record whose derived numbers come from the cell's own arithmetic."""
    conf = {**cell.BASE, "batch_size": batch, "accumulation_steps": accum, **config}
    metrics = {
        "rung_index": index,
        "parent": parent,
        "change": rung,
        "config": conf,
        "rung_wall_s": 2.0,
        "parameter_count": 3_406_809_600,
    }
    if status == "ok":
        metrics["step_ms_mean"] = ms
        metrics["step_ms_median"] = ms

    class Args:
        model_name = model
        context_length = ctx
        vocab_size = 10_000

    args = Args()
    args.model = model
    metrics.update(cell.derive(metrics, conf, args, "h100", GEMM))
    return make_record(
        "ladder",
        {"model": model, "context_length": ctx, "rung": rung},
        status,
        metrics,
        PROV,
        None if status == "ok" else "CUDA out of memory",
    )


def ladder_2p7b(best_ms):
    """2.7B: fp32 rungs out of memory, bf16 eager the first that runs, then faster rungs."""
    return [
        rung_record("2.7B", "baseline", 0, None, None, status="oom"),
        rung_record("2.7B", "tf32", 1, None, None, status="oom", tf32=True),
        rung_record("2.7B", "sdpa_flash", 2, "tf32", 400.0, tf32=True, precision="bf16", attention="sdpa_flash"),
        rung_record(
            "2.7B", "compile", 3, "sdpa_flash", 300.0, tf32=True, precision="bf16", attention="sdpa_flash", compile=True
        ),
        rung_record(
            "2.7B",
            "grad_accum",
            4,
            "compile",
            best_ms * 4,
            accum=4,
            tf32=True,
            precision="bf16",
            attention="sdpa_flash",
            compile=True,
        ),
    ]


def ms_for_mfu(mfu, accum=4):
    flops = cell.step_flops(config_from_name("2.7B", context_length=1024), 4, 1024, accum)["step_flops"]
    return flops / (mfu * 989.4e12) * 1e3 / accum


def test_goal_sentence_flips_at_the_goal():
    above = report.analyse(report.rung_table(ladder_2p7b(ms_for_mfu(0.60))))
    below = report.analyse(report.rung_table(ladder_2p7b(ms_for_mfu(0.50))))
    assert above["best"]["mfu_datasheet_bf16"] == pytest.approx(0.60)
    assert report.goal_sentence(above, "h100").startswith("Goal met: 2.7B reaches 60.0%")
    text = report.goal_sentence(below, "h100")
    assert text.startswith("Goal missed: 2.7B reaches 50.0%") and "5.0 points short of 55%" in text
    # other sizes and devices have no goal
    assert report.goal_sentence(above, "a100") is None


def test_baseline_sentence_depends_on_whether_it_fits():
    records = ladder_2p7b(ms_for_mfu(0.5))
    a = report.analyse(report.rung_table(records))
    text = " ".join(report.job_sentences(a))
    assert "baseline does not fit" in text and "first rung that runs is `sdpa_flash`" in text
    fitting = copy.deepcopy(records)
    fitting[0] = rung_record("2.7B", "baseline", 0, None, 2000.0)
    fitting[1] = rung_record("2.7B", "tf32", 1, "baseline", 800.0, tf32=True)
    b = report.analyse(report.rung_table(fitting))
    text = " ".join(report.job_sentences(b))
    assert "baseline does not fit" not in text
    best_tps = b["best"]["tokens_per_s"]
    assert f"{best_tps / (4 * 1024 / 2.0):.1f}× the baseline" in text


def test_largest_gain_is_named():
    records = [
        rung_record("small", "baseline", 0, None, 1000.0),
        rung_record("small", "tf32", 1, "baseline", 600.0, tf32=True),  # 1.67x
        rung_record("small", "bf16", 2, "tf32", 150.0, tf32=True, precision="bf16"),  # 4x: the largest
        rung_record("small", "compile", 3, "bf16", 100.0, tf32=True, precision="bf16", compile=True),  # 1.5x
    ]
    a = report.analyse(report.rung_table(records))
    assert a["largest_gain"]["rung"] == "bf16" and a["largest_gain"]["factor"] == pytest.approx(4.0)
    assert a["speedup"] == pytest.approx(10.0)
    # make compile the biggest step instead
    records[3] = rung_record("small", "compile", 3, "bf16", 30.0, tf32=True, precision="bf16", compile=True)
    a = report.analyse(report.rung_table(records))
    assert a["largest_gain"]["rung"] == "compile" and a["largest_gain"]["factor"] == pytest.approx(5.0)
    assert "The largest single gain is `compile` over `bf16`: 5.00×." in " ".join(report.job_sentences(a))


def test_limits_sentences_from_the_numbers():
    a = report.analyse(report.rung_table(ladder_2p7b(ms_for_mfu(0.5))))
    text = " ".join(report.limits_sentences(a, "h100"))
    best = a["best"]
    matmul_ms = best["step_flops"] / 750e12 * 1e3
    assert f"would take {matmul_ms:.2f} ms" in text or f"would take {matmul_ms:,.0f} ms" in text
    opt_ms = 3_406_809_600 * 28 / 3350e9 * 1e3
    assert f"at least {opt_ms:.2f} ms" in text
    assert "not profiled" in text


def test_report_cli_writes_section_table_and_waterfalls(tmp_path):
    paths = []
    for r in ladder_2p7b(ms_for_mfu(0.5)):
        p = tmp_path / "ladder" / f"2.7B_ctx1024_{r['cell']['rung']}.json"
        write_record(p, r)
        paths.append(str(p))
    gemm = make_record(
        "gemm_peak",
        {"probe": "square_gemm"},
        "ok",
        {
            "precisions": ["bf16"],
            "bf16_tflops": 750.0,
            "bf16_best_n": 8192,
            "bf16_datasheet_tflops": 989.4,
            "bf16_fraction_of_datasheet": 750 / 989.4,
        },
        PROV,
    )
    write_record(tmp_path / "gemm.json", gemm)
    assert (
        report.main(
            [
                "--device",
                "h100",
                "--csv",
                str(tmp_path / "t.csv"),
                "--sections-dir",
                str(tmp_path / "s"),
                "--figures-dir",
                str(tmp_path / "f"),
                "--jobs",
                "2.7B:1024",
                "xl:1024",
                "--records",
                *paths,
                str(tmp_path / "gemm.json"),
            ]
        )
        == 0
    )
    text = (tmp_path / "s" / "speed_ladder.md").read_text()
    assert "Goal missed" in text and "causal attention counted in full" in text and "75.8%" in text
    assert (tmp_path / "f" / "ladder_2.7B_ctx1024.png").stat().st_size > 0
    assert (tmp_path / "f" / "ladder_xl_ctx1024.png").stat().st_size > 0  # placeholder: no records
    assert len((tmp_path / "t.csv").read_text().splitlines()) == 6


def test_every_ladder_says_what_bounds_its_best_rung(tmp_path):
    """Not only the goal's model: each size's best rung gets the matmul and optimizer floors."""
    paths = []
    for r in ladder_2p7b(ms_for_mfu(0.5)):
        r = copy.deepcopy(r)
        r["cell"]["model"] = "medium"
        p = tmp_path / "ladder" / f"medium_ctx1024_{r['cell']['rung']}.json"
        write_record(p, r)
        paths.append(str(p))
    args = ["--device", "h100", "--csv", str(tmp_path / "t.csv"), "--sections-dir", str(tmp_path / "s")]
    args += ["--figures-dir", str(tmp_path / "f"), "--jobs", "medium:1024", "--records", *paths]
    assert report.main(args) == 0
    text = (tmp_path / "s" / "speed_ladder.md").read_text()
    assert "Goal" not in text  # the goal is the 2.7B model's
    assert "The fp32 AdamW update alone moves 28 bytes per parameter" in text and "not profiled" in text


def profile_record(best, matmul_ms_per_step, other_ms_per_step, steps=3):
    window = steps * (matmul_ms_per_step + other_ms_per_step + 1.0)
    metrics = {
        "rung": best["rung"],
        "profiled_steps": steps,
        "window_ms": window,
        "busy_fraction": 0.99,
        "idle_ms": steps * 1.0,
        "idle_in_gaps_over_threshold_ms": 0.5,
        "gaps_over_threshold": 3,
        "gap_threshold_us": 10.0,
        "top_kernels": [{"name": "nvjet_x", "share": 0.7}],
        "class_ms": {
            "matmul": steps * matmul_ms_per_step,
            "elementwise": steps * other_ms_per_step * 0.6,
            "optimizer": steps * other_ms_per_step * 0.4,
        },
        "class_share": {"matmul": 0.7, "elementwise": 0.2, "optimizer": 0.1},
    }
    return make_record("ladder_profile", {"model": "2.7B", "context_length": 1024}, "ok", metrics, PROV)


def test_profile_split_says_whether_matmuls_alone_could_reach_the_goal():
    a = report.analyse(report.rung_table(ladder_2p7b(ms_for_mfu(0.5))))
    best = a["best"]
    flops = best["step_flops"]
    # matmuls at 80% of the datasheet: the goal needs less other work
    fast_mm = flops / (0.80 * 989.4e12) * 1e3
    text = report.profile_split(profile_record(best, fast_mm, 300.0)["metrics"], best)
    assert "matmuls alone would reach 80.0%" in text and "means cutting" in text
    target = flops / (0.55 * 989.4e12) * 1e3
    assert f"cutting {fast_mm + 301.0 - target:,.0f} ms of the 301 ms" in text
    # matmuls at 50%: even they alone miss the goal
    slow_mm = flops / (0.50 * 989.4e12) * 1e3
    text = report.profile_split(profile_record(best, slow_mm, 10.0)["metrics"], best)
    assert "Even with nothing but these matmuls, MFU would be 50.0%" in text
    # the sentence reaches the report through limits_sentences
    joined = " ".join(report.limits_sentences(a, "h100", profile_record(best, fast_mm, 40.0)))
    assert "Nsight Systems profile of `grad_accum`" in joined and "not profiled" not in joined


def test_report_without_records_writes_an_empty_section(tmp_path):
    # report-only mode on a device whose ladder has not run yet: the rule passes `--records` and nothing
    assert (
        report.main(
            [
                "--device",
                "h200",
                "--csv",
                str(tmp_path / "t.csv"),
                "--sections-dir",
                str(tmp_path / "s"),
                "--figures-dir",
                str(tmp_path / "f"),
                "--jobs",
                "small:1024",
                "--records",
            ]
        )
        == 0
    )
    assert "_No ladder records on this device._" in (tmp_path / "s" / "speed_ladder.md").read_text()
    assert (tmp_path / "f" / "ladder_small_ctx1024.png").stat().st_size > 0


def test_a_profile_from_another_run_of_the_ladder_is_named():
    a = report.analyse(report.rung_table(ladder_2p7b(ms_for_mfu(0.5))))
    best = a["best"]
    same = profile_record(best, 100.0, 40.0)
    same["metrics"]["step_ms_ladder"] = best["step_ms"] * (1 + report.PROFILE_RUN_TOLERANCE / 2)
    assert report.profile_run_sentence(same, best) is None
    joined = " ".join(report.limits_sentences(a, "h100", same))
    assert "another run" not in joined
    other = profile_record(best, 100.0, 40.0)
    other["metrics"]["step_ms_ladder"] = best["step_ms"] * (1 + report.PROFILE_RUN_TOLERANCE * 2)
    text = report.profile_run_sentence(other, best)
    assert "another run of the ladder (commit `abc`)" in text
    assert f"the ladder record now says {report.fmt(best['step_ms'])} ms" in text
    assert text in " ".join(report.limits_sentences(a, "h100", other))
    other["metrics"]["rung"] = "compile"
    assert "is of `compile`, not of today's best rung" in report.profile_run_sentence(other, best)


def _gemm_record(precisions=("bf16",)):
    metrics = {"precisions": list(precisions)}
    for p in precisions:
        metrics |= {f"{p}_tflops": 750.0, f"{p}_best_n": 8192, f"{p}_datasheet_tflops": 989.4}
        metrics[f"{p}_fraction_of_datasheet"] = 750 / 989.4
    return make_record("gemm_peak", {"probe": "square_gemm"}, "ok", metrics, PROV)


def test_the_gemm_ceiling_table_is_promised_only_where_it_is_shown():
    ladder = ladder_2p7b(ms_for_mfu(0.5))
    df = report.rung_table(ladder)
    jobs = [("2.7B", 1024)]
    shown = report.section(df, [*ladder, _gemm_record()], "h100", jobs)
    assert "against the best rate a square bf16 GEMM reaches on this device (below)." in shown
    assert "Measured GEMM ceilings" in shown and "the GEMM ceiling in `results/h100/gemm_peak/`" in shown
    assert "no square bf16 GEMM ceiling" not in shown
    # no gemm_peak record (a device whose ceiling was not measured yet): no promise, no table, no source;
    # a ceiling of fp32 only: its table, but no bf16 ceiling promised
    for records, table in ((ladder, False), ([*ladder, _gemm_record(("fp32",))], True)):
        text = report.section(df, records, "h100", jobs)
        assert "(below)" not in text
        assert ("Measured GEMM ceilings" in text) == table and ("the GEMM ceiling in" in text) == table
        assert (
            "MFU is given against the datasheet's dense bf16 peak; no square bf16 GEMM ceiling has been measured "
            "on this device " + ("(its `gemm_peak` record has no bf16)." if table else "(no `gemm_peak` record).")
        ) in text
    # no ladder record either (report-only on a device the ladder has not run on)
    empty = report.section(report.rung_table([]), [], "h200", [])
    assert "(below)" not in empty and "datasheet's dense bf16 peak; no square bf16 GEMM ceiling" in empty
    # the CPU: neither a datasheet peak nor, without a gemm_peak record, a measured ceiling
    cpu = report.section(report.rung_table([]), [], "cpu", [])
    assert "(below)" not in cpu and "MFU needs a peak to compare with: no datasheet peak is known" in cpu
    cpu = report.section(report.rung_table([]), [_gemm_record()], "cpu", [])
    assert "MFU is given against the best rate a square bf16 GEMM reaches on this device (below); no datasheet" in cpu
    assert "Measured GEMM ceilings" in cpu


def test_profile_split_of_a_step_already_within_the_goal_asks_for_no_cut():
    a = report.analyse(report.rung_table(ladder_2p7b(ms_for_mfu(0.6))))
    best = a["best"]
    target = best["step_flops"] / (0.55 * 989.4e12) * 1e3
    mm = best["step_flops"] / (0.70 * 989.4e12) * 1e3
    text = report.profile_split(profile_record(best, mm, target - mm - 50.0)["metrics"], best)
    assert "means cutting" not in text and "0.00 ms" not in text
    assert f"is already within the {target:,.0f} ms that 55% allows" in text


def test_small_ladders_read_right_without_a_datasheet_peak():
    import pandas as pd

    assert report.flop_amount(174.4e12) == "174.4 TFLOP" and report.flop_amount(2.4e9) == "2.40 GFLOP"
    sheet = pd.DataFrame({"status": ["ok", "oom"], "mfu_datasheet_bf16": [0.3, float("nan")]})
    none = pd.DataFrame({"status": ["ok", "ok"], "mfu_datasheet_bf16": [float("nan"), float("nan")]})
    assert report.pivot_yardstick(sheet) == "MFU of the bf16 datasheet peak"
    assert "measured bf16 GEMM ceiling: no datasheet peak" in report.pivot_yardstick(none)
    a = report.analyse(report.rung_table(ladder_2p7b(ms_for_mfu(0.5))))
    unprofiled = {"status": "unsupported", "reason": "needs a CUDA device; this cell runs on the CPU"}
    joined = " ".join(report.limits_sentences(a, "cpu", unprofiled))
    assert "this cell runs on the CPU." in joined
    records = ladder_2p7b(ms_for_mfu(0.5))
    text = report.section(report.rung_table(records), records, "h100", [("2.7B", 1024)])
    assert "The ladder took" in text and "The 1 ladders" not in text


def test_a_slower_bf16_rung_on_a_cpu_is_explained_not_bare():
    """On a CPU the bf16 rung can run at about 0.1x its parent: the section says so with the ratio, the
    measured GEMM rates of both precisions, and why in CPU terms; the method says no synchronize."""
    ladder = [
        rung_record("tiny", "baseline", 0, None, 100.0, ctx=32),
        rung_record("tiny", "bf16", 2, "baseline", 1000.0, ctx=32, precision="bf16"),
        rung_record("tiny", "fused_adamw", 3, "baseline", 80.0, ctx=32, fused_adamw=True),
    ]
    metrics = {"precisions": ["fp32", "bf16"], "fp32_tflops": 0.2, "bf16_tflops": 0.02}
    metrics |= {"fp32_best_n": 256, "bf16_best_n": 256}
    gemm = make_record("gemm_peak", {"probe": "square_gemm"}, "ok", metrics, PROV)
    df = report.rung_table(ladder)
    cpu = report.section(df, [*ladder, gemm], "cpu", [("tiny", 32)])
    assert (
        "On this CPU `bf16` runs at 0.10× the tokens/s of its parent `baseline` (slower; `SAME` = 3%), where a "
        "square bf16 GEMM reaches 0.10× fp32's rate (the ceilings above)."
    ) in cpu
    assert "slow fallback path" in cpu and "so the slower `bf16` is not carried forward" in cpu
    assert "no device to synchronize with" in cpu and "with a synchronize" not in cpu
    for gpu_words in ("tensor core", "kernel", "launch", "HBM"):
        assert gpu_words not in cpu.split("On this CPU", 1)[1].split("\n")[0], gpu_words
    # about as fast: no 'not carried forward'; without a gemm_peak record: no GEMM rates cited
    ladder[1] = rung_record("tiny", "bf16", 2, "baseline", 101.0, ctx=32, precision="bf16")
    same = report.section(report.rung_table(ladder), ladder, "cpu", [("tiny", 32)])
    assert "(about as fast; `SAME` = 3%). bf16 on a CPU" in same and "not carried forward" not in same
    # a GPU ladder: neither the CPU sentence nor the CPU method
    gpu = report.section(report.rung_table(ladder), ladder, "h100", [("tiny", 32)])
    assert "On this CPU" not in gpu and "with a synchronize around the whole step" in gpu


def test_the_profile_sentence_names_kernels_short_with_a_legend():
    records = ladder_2p7b(ms_for_mfu(0.5))
    a = report.analyse(report.rung_table(records))
    profile = profile_record(a["best"], 100.0, 40.0)
    nvjet = "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"
    profile["metrics"]["top_kernels"] = [
        {"name": nvjet, "share": 0.2},
        {"name": "multi_tensor_apply_kernel[FusedAdamMathFunctor]", "share": 0.1},
    ]
    text = report.section(report.rung_table(records), [*records, profile], "h100", [("2.7B", 1024)])
    assert (
        "top kernels: `nvjet 320x128x64 1x2 NNT` 20.0%, `multi_tensor_apply_kernel[FusedAdamMathFunctor]` 10.0%."
        in text
    )
    assert f"Kernel names in full:\n\n- `nvjet 320x128x64 1x2 NNT`: `{nvjet}`" in text
    assert f"`{nvjet}` 20.0%" not in text


def test_the_tables_name_the_step_statistic_their_records_used():
    new = pd.DataFrame({"step_statistic": ["median", "median"]})
    old = pd.DataFrame({"step_statistic": ["mean", "mean"]})
    assert report.step_words(new) == "median ms/step"
    assert report.step_words(old) == "mean ms/step"
    assert (
        report.step_words(pd.concat([new, old]))
        == "ms/step (mean or median of the measured steps, as each record says)"
    )
    # a record from before the field: its step time is the mean
    record = rung_record("small", "baseline", 0, None, 10.0)
    del record["metrics"]["step_statistic"]
    record["metrics"]["step_ms_mean"], record["metrics"]["step_ms_median"] = 12.0, 10.0
    assert report.rung_table([record]).step_ms.iloc[0] == 12.0
