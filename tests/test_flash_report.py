"""Sentences of the flash report that must hold for every input: out of memory against not measured,
the tiles every entry ran, the timing function the records name, the products fp32 ran."""

from __future__ import annotations

from lmperf.kinds.flash import report


def _bench(impl, d, n, status="ok", precision="fp32", **settings):
    ms = None if status != "ok" else 1.0
    return {
        "cell": {
            "test": "benchmark",
            "implementation": impl,
            "precision": precision,
            "head_dim": d,
            "sequence_length": n,
            "batch_size": 1,
            "causal": True,
        },
        "status": status,
        "reason": "out of memory" if status == "oom" else None,
        "metrics": {
            "forward_ms_median": ms,
            "backward_ms_median": ms,
            "forward_backward_ms_median": ms,
            "speedup_vs_plain_forward_backward": 1.0 if impl != "plain" and ms else None,
            "speedup_vs_plain_forward": 1.0 if impl != "plain" and ms else None,
        },
        "provenance": {
            "device_slug": "h100",
            "code_version": "6f1cea485d6eb0d6",
            "matmul_allow_tf32": False,
            "settings": {
                "precision": precision,
                "implementations": ["plain", "flash_triton"],
                "head_dims": [16, 128],
                "sequence_lengths": [1024, 2048],
                "warmup_ms": 10.0,
                "rep_ms": 50.0,
                "batch_size": 1,
                "causal": True,
                **settings,
            },
        },
    }


def _grid():
    """plain runs out of memory at N = 2048; flash_triton d = 128, N = 2048 has no record."""
    return [
        _bench("plain", 16, 1024),
        _bench("plain", 16, 2048, "oom"),
        _bench("plain", 128, 1024),
        _bench("plain", 128, 2048, "oom"),
        _bench("flash_triton", 16, 1024),
        _bench("flash_triton", 16, 2048),
        _bench("flash_triton", 128, 1024),
    ]


def test_a_missing_record_is_not_measured_not_out_of_memory():
    records = _grid()
    df = report.bench_frame(records)
    text = report.bench_sentences(df, "fp32", report.planned_cells(records))
    assert (
        "Plain attention first runs out of memory (status oom) at N = 2048 for d = 16 (flash_triton ran up to "
        "N = 2048); N = 2048 for d = 128 (flash_triton ran up to N = 1024; it has no record at N = 2048: not "
        "measured)." in text
    )
    assert "No record yet (not measured, so not out of memory): flash_triton at d = 128, N = 2048." in text
    assert "flash_triton runs out of memory" not in text  # no flash_triton record has status oom
    # without the settings, the cells other implementations have still show the gap
    assert "flash_triton at d = 128, N = 2048" in report.bench_sentences(df, "fp32")
    # a record with status oom is what out of memory means
    oom = report.bench_frame([*records, _bench("flash_triton", 128, 2048, "oom")])
    text = report.bench_sentences(oom, "fp32")
    assert "flash_triton runs out of memory at d = 128, N ≥ 2048." in text and "No record yet" not in text


def test_the_intro_names_the_timing_function_of_the_records():
    records = _grid()
    text = report.section_benchmarking(records, report.bench_frame(records), "h100", "fig")
    assert text.startswith("`lmperf.kinds.flash.harness.time_attention`:")  # the default: no timing named
    assert "lmperf.kernels.flash.bench" not in text and "— = no record (not measured)" in text
    named = [_bench("plain", 16, 1024, timing="lmperf.benchmarks.other.timer: do_bench medians")]
    text = report.section_benchmarking(named, report.bench_frame(named), "h100", "fig")
    assert text.startswith("`lmperf.benchmarks.other.timer`:")


def test_fp32_products_follow_the_code_that_wrote_the_record():
    ieee = [_bench("flash_triton", 16, 1024)]
    assert report._triton_products(ieee, "fp32") == ["IEEE"]  # code version, allow_tf32 off: IEEE
    text = report.section_benchmarking(ieee, report.bench_frame(ieee), "h100", "fig")
    assert "### fp32 (IEEE float32 products)" in text and "TF32" not in text
    old = [_bench("flash_triton", 16, 1024)]
    del old[0]["provenance"]["code_version"]
    assert report._triton_products(old, "fp32") == ["TF32"]
    tf32 = [_bench("flash_triton", 16, 1024)]
    tf32[0]["provenance"]["matmul_allow_tf32"] = True
    assert report._triton_products(tf32, "fp32") == ["TF32"]
    named = [_bench("flash_triton", 16, 1024, dot_precision="ieee")]
    del named[0]["provenance"]["code_version"]
    assert report._triton_products(named, "fp32") == ["IEEE"]
    assert report._triton_products(named, "bf16") == []


def test_fp32_rows_of_3xtf32_kernels_are_labelled_so():
    split = [_bench("flash_triton", 16, 1024, dot_precision="tf32x3"), _bench("plain", 16, 1024)]
    assert report._triton_products(split, "fp32") == ["3xTF32"]
    text = report.section_benchmarking(split, report.bench_frame(split), "h100", "fig")
    assert "### fp32 (fp32 inputs; flash_triton: 3xTF32 products)" in text
    assert "IEEE float32 products)" not in text and 'input_precision="tf32x3"' in text


def _tiles(fwd, dkdv, dq):
    def one(m, n):
        return {"config": {"BLOCK_M": m, "BLOCK_N": n, "num_warps": 4, "num_stages": 2}, "source": "heuristic"}

    return {"fwd": one(*fwd), "dkdv": one(*dkdv), "dq": one(*dq)}


def test_every_tile_set_the_entries_ran_is_named_with_its_count():
    big, small = _tiles((128, 64), (64, 64), (128, 64)), _tiles((64, 64), (32, 64), (64, 32))
    entries = [
        {"precision": p, "head_dim": d, "tiles": big if d <= 64 else small}
        for p in ("fp32", "bf16")
        for d in (16, 64, 128)
        for _ in range(2)
    ]
    record = {
        "metrics": {
            "entries_detail": entries,
            # the record's list of every tile seen: the first of each is not what every entry ran
            "triton_tiles": {k: [big[k]["config"], small[k]["config"]] for k in big},
        }
    }
    text = report._tiles_text(record)
    assert text == (
        "; tiles (BLOCK_M×BLOCK_N, forward / dK/dV pass / dQ pass): 128×64 / 64×64 / 128×64 in 8 entries "
        "(fp32, bf16 d ≤ 64), 64×64 / 32×64 / 64×32 in 4 entries (fp32, bf16 d = 128)"
    )
    # without per-entry tiles: every tile listed, none passed off as the only one
    del record["metrics"]["entries_detail"]
    text = report._tiles_text(record)
    assert "used across the entries: forward 128×64, 64×64" in text and "dQ pass 128×64, 64×32" in text


def test_leaderboard_says_how_our_tiles_were_chosen():
    from lmperf.kinds.flash import report as flash_report

    tuned = {"first_runs": {"tuning_s": 95.7, "tile_sources": {"committed": 0, "tuned": 6, "candidates_failed": 0}}}
    text = flash_report.leaderboard_tiles_sentence(tuned)
    assert "6 tuned in the run" in text and "tuning took 95.7 s before timing, not part of the times" in text
    remembered = {"first_runs": {"tuning_s": 0.0, "tile_sources": {"committed": 6, "tuned": 0}}}
    text = flash_report.leaderboard_tiles_sentence(remembered)
    assert "6 remembered for this device" in text and "tuning took" not in text
    assert flash_report.leaderboard_tiles_sentence({}) == ""


def _sdpa(precision="fp32", slug="h100", backend="EFFICIENT_ATTENTION"):
    record = _bench("sdpa", 16, 1024, precision=precision, sdpa_backend=backend, dot_precision="tf32x3")
    record["provenance"]["device_slug"] = slug
    if precision == "tf32":
        record["provenance"]["matmul_allow_tf32"] = True
    return record


def test_sdpa_fp32_rows_say_they_ran_3xtf32_not_ieee():
    """PyTorch's memory-efficient SDPA multiplies fp32 in 3xTF32 on TF32-capable GPUs whatever allow_tf32
    says: neither the fp32 table (IEEE) nor the tf32 table (TF32) may give its rows the plain rows' products."""
    grid = [_bench("flash_triton", 16, 1024, dot_precision="tf32x3"), _bench("plain", 16, 1024), _sdpa()]
    text = report.section_benchmarking(grid, report.bench_frame(grid), "h100", "fig")
    assert "### fp32 (fp32 inputs; flash_triton: 3xTF32 products; sdpa: 3xTF32 products)" in text
    assert "the other implementations' matmuls ran in IEEE fp32" not in text
    assert "plain's matmuls ran in IEEE fp32" in text and "sdpa ran 3xTF32 products" in text
    plain_tf32 = _bench("plain", 16, 1024, precision="tf32")
    plain_tf32["provenance"]["matmul_allow_tf32"] = True
    grid_tf32 = [plain_tf32, _sdpa("tf32")]
    text = report.section_benchmarking(grid_tf32, report.bench_frame(grid_tf32), "h100", "fig")
    assert "### tf32 (float32 inputs, TF32 tensor-core products; sdpa: 3xTF32 products)" in text
    assert "not TF32 arithmetic" in text
    # no claim where the backend or the device does not decide it: the flash backend (bf16 only), a CPU
    for other in ([_sdpa(slug="cpu")], [_sdpa(backend="FLASH_ATTENTION")], [_sdpa(slug="unknown-gpu")]):
        text = report.section_benchmarking(other, report.bench_frame(other), "h100", "fig")
        assert "3xTF32" not in text


def test_pytorch_attention_sdpa_fp32_rows_name_their_backend_and_products():
    from lmperf.kinds.attention import report as attention

    def rec(impl, status="ok", slug="h100"):
        settings = {"implementation": impl}
        if impl == "sdpa":
            settings["sdpa_backends"] = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]
        return {
            "status": status,
            "cell": {"implementation": impl, "precision": "fp32"},
            "provenance": {"device_slug": slug, "settings": settings},
        }

    records = [rec("sdpa"), rec("sdpa_cudnn", "unsupported")]
    heading, text = attention.products_paragraph(records, "sdpa")
    assert heading == "fp32 inputs, 3xTF32 products"
    assert "EFFICIENT_ATTENTION backend" in text and "not IEEE float32 arithmetic" in text
    # cuDNN ran here too: the backend is not known, so nothing is claimed; nor on a CPU
    assert attention.products_paragraph([rec("sdpa"), rec("sdpa_cudnn")], "sdpa") is None
    assert attention.products_paragraph([rec("sdpa", slug="cpu"), rec("sdpa_cudnn", "unsupported")], "sdpa") is None
