"""The nsys report names the fp32 top matmul kernels by how many cells have each, none cut silently."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from lmperf.kinds.nsys import report
from lmperf.report.common import load

A = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_execute_kernel"
B = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_execute_kernel"
C = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_execute_kernel"


def committed_frame(pattern: str) -> pd.DataFrame:
    """The report's frame of the first committed GPU device with nsys records matching ``pattern``
    (its fp32 e2e records beside); skips where none has them."""
    root = Path(__file__).resolve().parents[1]
    for kind in sorted(p for p in root.glob("results/*/nsys") if p.parent.name != "cpu"):
        if any(kind.glob(pattern)):
            return report.frame(load(kind.glob("*.json")), load((kind.parent / "e2e").glob("*_fp32_eager_w5.json")))
    pytest.skip(f"no committed GPU nsys records {pattern}")


def test_top_matmuls_are_ranked_by_cells_not_by_name():
    # B sorts after A and C by name but is the top matmul in most cells
    cells = pd.DataFrame({"inference_fwd_top_matmul": [B] * 5 + [A] * 3 + [C] * 2 + [None]})
    shown, text = report.top_matmuls(cells)
    assert shown == [B, A, C]
    assert text == (
        "the fp32 forward's top matmul kernel, by how many of the 10 fp32 cells have it as their top matmul: "
        "`xmma gemm f32f32 tn 64x64x8` in 5 cells, `xmma gemm f32f32 tn 128x128x8` in 3 cells, "
        "`xmma gemm f32f32 tn 128x64x8` in 2 cells"
    )
    shown, text = report.top_matmuls(cells, limit=2)
    assert shown == [B, A] and text.endswith("in 3 cells, and 1 more")


def test_bf16_cells_are_a_table_beside_fp32_and_other_top_kernels_are_counted():

    df = committed_frame("*_bf16_inference.json")
    text = report.section_b(df)
    bf16 = df[(df.precision == "bf16") & (df.inference_status == "ok")]
    fp32 = df[(df.precision == "fp32") & (df.inference_status == "ok")]
    table = text.split("the bf16 cells, beside fp32's:\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(table) == 2 + len(bf16)  # header, rule, one row per bf16 cell
    for r in bf16.itertuples():
        ref = fp32[(fp32.model == r.model) & (fp32.context_length == r.context_length)].iloc[0]
        row = next(
            line
            for line in table[2:]
            if line.split("|")[1].strip() == r.model and int(line.split("|")[2]) == r.context_length
        )
        assert (
            f"{100 * r.inference_fwd_matmul_share:.1f}%" in row
            and f"{100 * ref.inference_fwd_matmul_share:.1f}%" in row
        )
    # the other top kernels are counted by name, adding up to the cells not led by the most common one
    other = re.search(r"In the other (\d+) cells \(rows of the table\) it is (.*?)\. ", text)
    counts = [int(n) for n in re.findall(r"\((\d+) cells?\)", other.group(2))]
    assert sum(counts) == int(other.group(1)) and "Elsewhere the top kernel is" not in text
    assert "\n\n\n" not in text


def test_profiled_forward_verdicts_flip_at_agree():
    """nsys (a): 'agree within AGREE' against the timer and against the e2e records, on both sides."""

    df = committed_frame("*.json")
    inside, outside = 1 + report.AGREE / 2, 1 + 2 * report.AGREE
    close = df.assign(inference_nvtx_over_timer=inside, inference_nvtx_over_e2e=inside)
    text = report.section_a(close)
    assert "they agree within 5% (`AGREE`) in every cell" in text
    assert "profiling did not slow the forward down" in text and "Where it is slower" not in text
    far = df.assign(inference_nvtx_over_timer=outside, inference_nvtx_over_e2e=outside)
    text = report.section_a(far)
    assert "they differ by up to 10.0%" in text and "Where it is slower" in text
