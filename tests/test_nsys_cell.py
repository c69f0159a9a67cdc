"""The nsys cell end to end on a CPU (the torch.profiler fallback), its report, and nsys failures."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch

from lmperf.core.record import load_record
from lmperf.kinds.nsys import cell, report
from lmperf.model import config_from_name
from lmperf.profiling import nsys as nsys_tool


@pytest.fixture(scope="module")
def cpu_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("nsys")
    template = str(out / "tiny_ctx{ctx}_fp32_{mode}.json")
    assert cell.main(_cpu_args(template, "tiny")) == 0
    return out, sorted(out.glob("*.json"))


def test_fallback_writes_one_record_per_length_and_mode(cpu_records):
    _, paths = cpu_records
    assert [p.name for p in paths] == [
        "tiny_ctx16_fp32_inference.json",
        "tiny_ctx16_fp32_training.json",
        "tiny_ctx8_fp32_inference.json",
        "tiny_ctx8_fp32_training.json",
    ]
    for path in paths:
        r = load_record(path)
        m = r["metrics"]
        assert r["status"] == "ok" and r["kind"] == "nsys"
        assert m["profiler"] == "torch.profiler" and "no CUDA" in m["profiler_note"]
        assert m["report_path"] is None and m["nvtx_overhead"] is None
        phases = (
            ("inference_forward",)
            if r["cell"]["mode"] == "inference"
            else ("forward", "backward", "optimizer_step", "forward_backward", "training_step")
        )
        assert set(m["phases"]) == set(phases)
        for phase in phases:
            s = m["phases"][phase]
            assert s["steps"] == 2 and s["launches_per_step"] > 0 and len(s["top_kernels"]) <= 8
        fwd = phases[0]
        # CPU operators' self times within a forward cannot exceed the forward's wall time
        assert 0 < m["phases"][fwd]["kernel_ms_per_step"] <= m["phases"][fwd]["range_ms_mean"] * 1.01
        assert m["forward_cross_check"]["nvtx_range_over_timer"] == pytest.approx(1.0, rel=0.2)
        assert m[f"{fwd}_n"] == 2 and len(m[f"{fwd}_ms_samples"]) == 2
        # where the process's time went: the profiled steps, reading the trace, the NVTX timing (none on CPU)
        assert set(m["stage_s"]) == {"profile", "read", "nvtx_overhead"}
        assert m["stage_s"]["profile"] > 0 and m["stage_s"]["read"] >= 0 and m["stage_s"]["nvtx_overhead"] >= 0
        assert 0 < m["capture_start_process_age_s"] < r["provenance"]["process_age_s"]


def test_fallback_sees_the_attention_ranges_and_counts_their_flops(cpu_records):
    _, paths = cpu_records
    r = load_record(next(p for p in paths if p.name == "tiny_ctx16_fp32_inference.json"))
    att = r["metrics"]["attention"]["ranges"]
    c = config_from_name("tiny")
    B, H, T, d, L = 2, c.num_heads, 16, c.d_head, c.num_layers
    assert att["computing attention scores"]["flops_per_step"] == L * 2 * B * H * T * T * d
    assert att["final matmul"]["flops_per_step"] == L * 2 * B * H * T * T * d
    assert att["computing softmax"]["flops_per_step"] == L * 5 * B * H * T * T
    for name in att:
        assert att[name]["range_count_per_step"] == L  # one range per layer per forward
    assert att["computing attention scores"]["matmul_ms_per_step"] > 0  # the QK^T bmm is inside
    assert att["final matmul"]["matmul_ms_per_step"] > 0
    assert att["computing softmax"]["matmul_ms_per_step"] == 0


def _cpu_args(template: str, *models: str) -> list[str]:
    """The module fixture's settings (tiny at 16 and 8, 1 warm-up and 2 measured steps) for ``models``."""
    return [
        "--output",
        template,
        "--device",
        "cpu",
        "--models",
        *models,
        "--context-lengths",
        "16",
        "8",
        "--precision",
        "fp32",
        "--warmup-steps",
        "1",
        "--measured-steps",
        "2",
        "--batch-size",
        "2",
        "--vocab-size",
        "500",
        "--top-kernels",
        "8",
    ]


def test_several_sizes_in_one_process_read_their_own_blocks(cpu_records, tmp_path):
    """mini then tiny in one process and one capture: each size's records count only its own blocks,
    so tiny's operators per step are those of tiny profiled alone (the module fixture), and mini's
    are more (twice tiny's layers)."""
    assert cell.main(_cpu_args(str(tmp_path / "{model}_ctx{ctx}_fp32_{mode}.json"), "mini", "tiny")) == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(
        f"{m}_ctx{c}_fp32_{mode}.json" for m in ("mini", "tiny") for c in (16, 8) for mode in ("inference", "training")
    )
    alone = {(r["cell"]["context_length"], r["cell"]["mode"]): r for r in map(load_record, cpu_records[1])}
    for path in tmp_path.glob("tiny_*.json"):
        r = load_record(path)
        m, ref = r["metrics"], alone[(r["cell"]["context_length"], r["cell"]["mode"])]["metrics"]
        assert r["cell"]["model"] == "tiny" and m["parameter_count"] == ref["parameter_count"]
        assert m["profiled_models"] == ["mini", "tiny"] and m["allocated_mib_at_start"] is None
        for phase, summary in m["phases"].items():
            assert summary["launches_per_step"] == ref["phases"][phase]["launches_per_step"], phase
            assert summary["steps"] == 2
        assert (
            m["attention"]["ranges"]["computing softmax"]["range_count_per_step"] == config_from_name("tiny").num_layers
        )
    for path in tmp_path.glob("mini_*.json"):
        r = load_record(path)
        m = r["metrics"]
        ref = alone[(r["cell"]["context_length"], r["cell"]["mode"])]["metrics"]
        assert m["parameter_count"] > ref["parameter_count"]
        assert (
            m["attention"]["ranges"]["computing softmax"]["range_count_per_step"] == config_from_name("mini").num_layers
        )
        fwd = "inference_forward" if r["cell"]["mode"] == "inference" else "forward"
        assert m["phases"][fwd]["launches_per_step"] > ref["phases"][fwd]["launches_per_step"]
        # mini ran first: its measured steps began before tiny's in the same process
        tiny = load_record(tmp_path / path.name.replace("mini_", "tiny_"))["metrics"]
        assert m["capture_start_process_age_s"] < tiny["capture_start_process_age_s"]


@pytest.mark.parametrize(
    ("output", "models", "message"),
    [
        ("x_ctx{ctx}_{mode}.json", ["tiny", "mini"], "name {model}"),
        ("{model}_ctx{ctx}_{mode}.json", ["tiny", "huge"], "unknown model size"),
        ("{model}_ctx{ctx}_{mode}.json", ["tiny", "tiny"], "twice"),
    ],
)
def test_models_are_checked_before_anything_runs(tmp_path, capsys, output, models, message):
    with pytest.raises(SystemExit):
        cell.parse_args(
            ["--output", str(tmp_path / output), "--device", "cpu", "--models", *models, "--context-lengths", "8"]
        )
    assert message in capsys.readouterr().err


def test_report_on_fallback_records(cpu_records, tmp_path):
    _, paths = cpu_records
    argv = [
        "--device",
        "cpu",
        "--csv",
        str(tmp_path / "nsys.csv"),
        "--kernels-csv",
        str(tmp_path / "k.csv"),
        "--sections-dir",
        str(tmp_path),
        "--figures-dir",
        str(tmp_path),
        "--records",
        *map(str, paths),
        "--e2e-records",
        str(tmp_path / "missing.json"),
    ]
    assert report.main(argv) == 0
    text = (tmp_path / "nsys_profile.md").read_text()
    for part in ("### (a)", "### (b)", "### (c)", "### (d)", "### (e)", "`torch.profiler`", "_Source: 4 records"):
        assert part in text
    assert "No end-to-end record" in text
    assert "![operator classes](" in text and "kernel classes" not in text
    assert (tmp_path / "nsys_class_shares.png").stat().st_size > 0
    assert (tmp_path / "nsys_attention.png").stat().st_size > 0
    import pandas as pd

    table = pd.read_csv(tmp_path / "nsys.csv")
    assert sorted(table.context_length) == [8, 16]
    r = load_record(next(p for p in paths if p.name == "tiny_ctx8_fp32_inference.json"))
    row = table[table.context_length == 8].iloc[0]
    assert row.inference_fwd_top_kernel == r["metrics"]["phases"]["inference_forward"]["top_kernels"][0]["label"]


def test_report_cross_checks_against_e2e_records(cpu_records):
    _, paths = cpu_records
    records = [load_record(p) for p in paths]
    fwd_ms = {16: 2.0, 8: 4.0}
    e2e = [
        {
            "kind": "e2e",
            "cell": {
                "model": "tiny",
                "context_length": ctx,
                "precision": "fp32",
                "compile": "eager",
                "warmup_steps": 5,
            },
            "metrics": {"inference_forward_ms_mean": ms, "forward_ms_mean": 2 * ms},
        }
        for ctx, ms in fwd_ms.items()
    ]
    df = report.frame(records, e2e)
    for row in df.itertuples():
        nsys_ms = next(
            r for r in records if r["cell"]["context_length"] == row.context_length and r["cell"]["mode"] == "inference"
        )["metrics"]["forward_cross_check"]["nvtx_range_ms_mean"]
        assert row.inference_nvtx_over_e2e == pytest.approx(nsys_ms / fwd_ms[row.context_length])


def test_nsys_requested_without_cuda_fails_loudly(tmp_path):
    with pytest.raises(nsys_tool.NsysError, match="CUDA|PATH"):
        cell.main(
            [
                "--output",
                str(tmp_path / "x_ctx{ctx}_{mode}.json"),
                "--device",
                "cpu",
                "--models",
                "tiny",
                "--context-lengths",
                "8",
                "--profiler",
                "nsys",
            ]
        )
    assert not list(tmp_path.glob("*.json"))


def test_output_must_be_a_template(tmp_path):
    with pytest.raises(SystemExit):
        cell.parse_args(
            ["--output", str(tmp_path / "x.json"), "--device", "cpu", "--models", "tiny", "--context-lengths", "8"]
        )


def _fake_nsys(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nsys"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_failing_nsys_raises_with_its_stderr(tmp_path, capsys):
    fake = _fake_nsys(tmp_path, 'echo "Error: unrecognised option --cpuctxsw" >&2; exit 3')
    with pytest.raises(nsys_tool.NsysError) as err:
        nsys_tool.profile(fake, tmp_path / "rep", ["python", "-c", "pass"])
    assert "exit status 3" in str(err.value) and "unrecognised option --cpuctxsw" in str(err.value)
    assert "unrecognised option" in capsys.readouterr().err  # echoed to the rule's log as well


def test_nsys_that_writes_no_report_raises(tmp_path):
    fake = _fake_nsys(tmp_path, 'echo "WARNING: no CUDA kernels captured" >&2; exit 0')
    with pytest.raises(nsys_tool.NsysError, match="wrote no report"):
        nsys_tool.profile(fake, tmp_path / "rep", ["python", "-c", "pass"])


def test_export_falls_back_to_stats_then_raises(tmp_path):
    fake = _fake_nsys(tmp_path, 'echo "export/stats unavailable: $1" >&2; exit 1')
    report_path = tmp_path / "r.nsys-rep"
    report_path.write_bytes(b"")
    with pytest.raises(nsys_tool.NsysError) as err:
        nsys_tool.export_sqlite(fake, report_path, tmp_path / "r.sqlite")
    assert "nsys export failed" in str(err.value) and "nsys stats failed" in str(err.value)


def test_configured_nsys_path_must_exist(tmp_path):
    with pytest.raises(nsys_tool.NsysError, match="not an executable"):
        nsys_tool.find_nsys(str(tmp_path / "no-nsys"))
    fake = _fake_nsys(tmp_path, "exit 0")
    assert nsys_tool.find_nsys(fake) == fake


@pytest.mark.skipif(
    not torch.cuda.is_available() or nsys_tool.find_nsys() is None, reason="needs a CUDA GPU and nsys on PATH"
)
def test_nsys_cell_on_gpu(tmp_path):
    """Two sizes in one nsys process and one capture: each size's records read its own part."""
    from lmperf.core.device import device_slug

    template = str(tmp_path / "{model}_ctx{ctx}_fp32_{mode}.json")
    assert (
        cell.main(
            [
                "--output",
                template,
                "--device",
                device_slug(),
                "--models",
                "mini",
                "tiny",
                "--context-lengths",
                "64",
                "--warmup-steps",
                "1",
                "--measured-steps",
                "1",
            ]
        )
        == 0
    )
    records = {m: json.loads((tmp_path / f"{m}_ctx64_fp32_training.json").read_text()) for m in ("mini", "tiny")}
    for model, r in records.items():
        m = r["metrics"]
        assert r["cell"]["model"] == model and m["profiled_models"] == ["mini", "tiny"]
        assert m["profiler"] == "nsys" and Path(m["sqlite_path"]).is_file()
        assert m["kernels_without_launch_time"] == 0
        assert m["phases"]["backward"]["launches_per_step"] > 0
        stages = m["stage_s"]
        assert set(stages) == {"profile", "export", "read", "nvtx_overhead"} and min(stages.values()) > 0
        # the profiled process reached this size's measured steps within the profile's wall time
        assert 0 < m["capture_start_process_age_s"] < stages["profile"]
    assert records["mini"]["metrics"]["allocated_mib_at_start"] == 0  # a fresh process
    assert records["tiny"]["metrics"]["allocated_mib_at_start"] == 0  # mini freed (cuBLAS too) before tiny began
    # a capture range and a report per size, in the order of --models
    reports = [Path(records[m]["metrics"]["report_path"]).name for m in ("mini", "tiny")]
    assert reports == ["nsys_fp32.range1.nsys-rep", "nsys_fp32.range2.nsys-rep"]
    assert "--capture-range-end=repeat:2" in records["tiny"]["metrics"]["nsys_options"]
    mini, tiny = (records[m]["metrics"]["phases"]["forward"]["launches_per_step"] for m in ("mini", "tiny"))
    assert mini > tiny  # 4 layers against 2: each size's kernels, not both


def test_out_of_memory_is_a_record_and_the_rest_is_measured(tmp_path, monkeypatch):
    real_step = cell.training_step

    def step(model, optimizer, tokens, *args, **kwargs):
        if tokens.shape[1] == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (simulated)")
        return real_step(model, optimizer, tokens, *args, **kwargs)

    monkeypatch.setattr(cell, "training_step", step)
    template = str(tmp_path / "tiny_ctx{ctx}_fp32_{mode}.json")
    assert (
        cell.main(
            [
                "--output",
                template,
                "--device",
                "cpu",
                "--models",
                "tiny",
                "--context-lengths",
                "8",
                "16",
                "--warmup-steps",
                "1",
                "--measured-steps",
                "1",
                "--batch-size",
                "2",
                "--vocab-size",
                "300",
            ]
        )
        == 0
    )
    status = {p.name: load_record(p)["status"] for p in tmp_path.glob("*.json")}
    assert status == {
        "tiny_ctx8_fp32_inference.json": "ok",
        "tiny_ctx8_fp32_training.json": "ok",
        "tiny_ctx16_fp32_inference.json": "ok",
        "tiny_ctx16_fp32_training.json": "oom",
    }
    oom = load_record(tmp_path / "tiny_ctx16_fp32_training.json")
    assert "training warm-up, ctx 16" in oom["reason"] and "out of memory" in oom["reason"]
    assert oom["metrics"]["profiler"] == "torch.profiler" and "phases" not in oom["metrics"]
    ok = load_record(tmp_path / "tiny_ctx8_fp32_training.json")["metrics"]
    assert ok["phases"]["backward"]["steps"] == 1  # the re-warm step after the OOM is not counted
    out = tmp_path / "report"
    assert (
        report.main(
            [
                "--device",
                "cpu",
                "--csv",
                str(out / "t.csv"),
                "--kernels-csv",
                str(out / "k.csv"),
                "--sections-dir",
                str(out),
                "--figures-dir",
                str(out),
                "--records",
                *map(str, sorted(tmp_path.glob("*.json"))),
            ]
        )
        == 0
    )
    text = (out / "nsys_profile.md").read_text()
    assert "Out of memory (recorded, not profiled): tiny/ctx 16/fp32 training." in text
    assert "| tiny    |        16 |" in text and "OOM" in text  # (b): no forward+backward top kernel there


def test_reports_of_several_capture_ranges_come_back_in_their_order(tmp_path):
    # an nsys that writes one report per capture range, the range's number before the suffix
    fake = _fake_nsys(
        tmp_path,
        'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && base=$2; case "$1" in --capture-range-end=*) end=$1;; esac; shift; done\n'
        'echo "$end" > "$base.options"\n'
        'for i in 10 2 1 3 4 5 6 7 8 9; do echo $i > "$base.$i.nsys-rep"; done',
    )
    old = tmp_path / "nsys_fp32.7.nsys-rep"
    old.write_text("left from an earlier run")
    os.utime(old, (1, 1))
    reports = nsys_tool.profile_ranges(fake, tmp_path / "nsys_fp32", ["python", "-c", "pass"], 10)
    assert [p.name for p in reports] == [f"nsys_fp32.range{i}.nsys-rep" for i in range(1, 11)]
    assert [p.read_text().strip() for p in reports] == [str(i) for i in range(1, 11)]
    assert (tmp_path / "nsys_fp32.options").read_text().strip() == "--capture-range-end=repeat:10"
    # one range: the plain profile and its one report
    one = _fake_nsys(tmp_path, 'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && base=$2; shift; done\ntouch "$base.nsys-rep"')
    assert nsys_tool.profile_ranges(one, tmp_path / "small_fp32", ["true"], 1) == [tmp_path / "small_fp32.nsys-rep"]
    none = _fake_nsys(tmp_path, "exit 0")
    with pytest.raises(nsys_tool.NsysError, match="wrote no report"):
        nsys_tool.profile_ranges(none, tmp_path / "other_fp32", ["true"], 3)


def test_report_name_with_a_dot_is_found(tmp_path):
    # an nsys that takes "2.7B_fp32" for a name with an extension and writes "2.nsys-rep"
    fake = _fake_nsys(
        tmp_path, 'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && base=$2; shift; done\ntouch "${base%%.*}.nsys-rep"'
    )
    report_path = nsys_tool.profile(fake, tmp_path / "2.7B_fp32", ["python", "-c", "pass"])
    assert report_path == tmp_path / "2.7B_fp32.nsys-rep" and report_path.is_file()


def test_the_cpu_report_says_cpu_words_for_cpu_data(cpu_records):
    """The CPU fallback's report speaks of CPU operators and profiler ranges: no GPU time, no NVTX range
    around its forwards, no nsys tracing CUDA calls; AdamW's time is not reported as 0%."""
    _, paths = cpu_records
    records = [load_record(p) for p in paths]
    df = report.frame(records, [])
    text = "\n".join(
        [report.section_a(df), report.section_b(df), report.section_c(records, df), report.section_d(df)]
        + [report.section_e(df)]
    )
    for gpu_words in ("GPU time", "NVTX range that closes", "nsys traces every CUDA API call", "Kernels launched"):
        assert gpu_words not in text, gpu_words
    assert "CPU time" in text and "profiler range" in text
    assert "the AdamW kernels take 0.00" not in text and "no operator is named as AdamW's" in text
    assert "its optimizer_step range takes" in text
    # headings, table headers and sentences call CPU operators operators, called not launched (operator
    # names themselves are in backticks or table rows, and none of the CPU's says kernel)
    words = re.findall(r"[^\n]*\b(?:kernels?|launch\w*|Launch\w*)\b[^\n]*", text)
    assert not words, words
    for heading in ("### (b) The top forward operator,", "### (c) Non-matmul operators above"):
        assert heading in text
    assert re.search(r"\|\s+operator sum \(ms\)\s+\|", text)


def test_the_cpu_figures_label_operator_time(cpu_records, tmp_path, monkeypatch):
    _, paths = cpu_records
    records = [load_record(p) for p in paths]
    labels = []

    def keep_labels(fig, path):
        labels.extend(t for ax in fig.axes for t in (ax.get_xlabel(), ax.get_ylabel()) if t)

    monkeypatch.setattr(report, "save", keep_labels)
    report.figures(report.frame(records, []), tmp_path)
    assert "share of operator time" in labels and "operator ms per forward (all layers)" in labels
    assert not [t for t in labels if "kernel" in t], labels


def test_a_size_with_no_block_left_is_not_captured_and_the_next_one_is(tmp_path, monkeypatch):
    """mini runs out of memory in every warm-up: its records say so, nothing of it is captured (under
    nsys no empty report), and tiny after it is measured as usual."""
    from lmperf.model import count_parameters

    mini = count_parameters(cell.TransformerLM(config_from_name("mini", vocab_size=500)))
    real_train, real_infer = cell.training_step, cell.inference_step

    def too_big(real):
        def step(model, *args, **kwargs):
            if count_parameters(model) == mini:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB (simulated)")
            return real(model, *args, **kwargs)

        return step

    monkeypatch.setattr(cell, "training_step", too_big(real_train))
    monkeypatch.setattr(cell, "inference_step", too_big(real_infer))
    seen = {}
    real_run = cell.run_measurements

    def run(args, model_name, device, capture):
        out = real_run(args, model_name, device, capture)
        seen[model_name] = out["captured"]
        return out

    monkeypatch.setattr(cell, "run_measurements", run)
    assert cell.main(_cpu_args(str(tmp_path / "{model}_ctx{ctx}_fp32_{mode}.json"), "mini", "tiny")) == 0
    assert seen == {"mini": False, "tiny": True}
    status = {p.name: load_record(p)["status"] for p in tmp_path.glob("*.json")}
    assert {name: s for name, s in status.items() if name.startswith("mini")} == {
        f"mini_ctx{c}_fp32_{m}.json": "oom" for c in (8, 16) for m in ("inference", "training")
    }
    assert {s for name, s in status.items() if name.startswith("tiny")} == {"ok"}
