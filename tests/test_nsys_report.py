"""The nsys report names the fp32 top matmul kernels by how many cells have each, none cut silently."""

from __future__ import annotations

import pandas as pd

from lmperf.report import nsys as report

A = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_execute_kernel"
B = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_execute_kernel"
C = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_execute_kernel"


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
