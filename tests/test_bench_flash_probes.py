"""bench/flash_bwd_probe.py, bench/flash_fwd_probe.py, bench/flash_bwd_fused.py and bench/flash_ab.py on CPU,
before they spend GPU time.

Their variant kernels run in Triton's interpreter (a subprocess each, with TRITON_INTERPRET=1):
the dK/dV variants against our dK/dV kernel (every layout and flag, tiles with more queries than
keys among them), the split forward against float64 attention. The sweeps' own code (what they
time, check and write) runs on tiny shapes with do_bench replaced by one call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the probes run for real")


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OUT": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def rows_of(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_dkdv_variants_agree_with_our_kernel(tmp_path):
    proc = run(["bench/flash_bwd_probe.py", "--check-only"], tmp_path)
    rows = rows_of(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # 2 shapes x 3 tiles x 3 layouts x 2 K/V loads x 2 orders, each judged
    assert len(rows) == 72 and all(r["ok"] for r in rows)
    assert {(r["BLOCK_M"], r["BLOCK_N"]) for r in rows} == {(16, 32), (32, 16), (32, 32)}
    assert sum(r["SWAP"] for r in rows) == 24


def test_one_pass_backward_agrees_with_float64(tmp_path):
    proc = run(["bench/flash_bwd_fused.py", "--check-only"], tmp_path)
    rows = rows_of(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # 3 shapes (causal with n_q = n_k and n_q > n_k, non-causal n_q < n_k) x (dP first or not, and the
    # query loop under tl.range's warp specialisation, which the interpreter runs as a plain loop)
    assert len(rows) == 9 and all(r["ok"] for r in rows)
    assert {r["config"]["DP_FIRST"] for r in rows} == {False, True}
    assert sum(r["config"].get("WARP_SPECIALIZE", False) for r in rows) == 3
    assert max(e for r in rows for e in r["errs"]) < 1e-5  # float32 in the interpreter, against float64


def test_split_forward_agrees_with_float64(tmp_path):
    proc = run(["bench/flash_fwd_probe.py"], tmp_path)
    rows = rows_of(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(rows) == 9 and all(r["ok"] for r in rows)
    assert {r["config"].get("SPLIT", 1) for r in rows} == {1, 2}


SWEEPS = """
import json, sys
import torch, triton.testing
sys.path.insert(0, "bench")
triton.testing.do_bench = lambda fn, *a, **k: (fn(), 1.0)[1]
torch.cuda.synchronize = lambda *a, **k: None
import flash_bwd_probe as bwd, flash_fwd_probe as fwd
import lmperf.kinds.flash.harness as bench
bench.make_inputs = lambda b, n, d, dtype: tuple(torch.randn(2, 80, d, dtype=torch.float16) for _ in range(4))
bwd.SWEEP_TILES = {16: [(16, 32, 4, 1), (32, 16, 4, 1)]}
fwd.TILES = {16: [(32, 16, 4, 1), (16, 16, 4, 1)]}
bwd.sweep(16, sys.argv[1] + "/bwd.json", top=2)
fwd.sweep(16, sys.argv[1] + "/fwd.json", top=2, batch=2, n=80, device="cpu")
"""


def test_sweeps_time_check_and_write_every_variant(tmp_path):
    proc = run(["-c", SWEEPS, str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    bwd = json.loads((tmp_path / "bwd.json").read_text())["sweep_d16"]
    # ours, then 2 tiles x (keys or queries along rows) x (dP first or not), then the 2 fastest
    # warp-specialised, then the 2 fastest launched batch-first
    assert [r["kernel"] for r in bwd] == ["ours"] + ["variant"] * 12
    assert all(r["rel_diff"] < 1e-2 for r in bwd[1:]), bwd
    assert [bool(r["config"].get("WS")) for r in bwd[1:]] == [False] * 8 + [True] * 2 + [False] * 2
    assert [bool(r["config"].get("BATCH_MAJOR")) for r in bwd[1:]] == [False] * 10 + [True] * 2
    fwd = json.loads((tmp_path / "fwd.json").read_text())["d16"]
    assert [r["kernel"] for r in fwd[:3]] == ["ours", "sdpa_cudnn", "sdpa_flash"]
    variants = [r for r in fwd if r["kernel"] == "variant"]
    assert len(variants) == 7 and all(r["max_abs_diff_vs_ours"] < 2e-2 for r in variants), variants
    assert sum(bool(r["config"].get("BATCH_MAJOR")) for r in variants) == 2


AB = """
import json, sys
import torch, triton.testing
sys.path.insert(0, "bench")
triton.testing.do_bench = lambda fn, *a, **k: (fn(), 1.0)[1]
import flash_ab, flash_bwd_probe
launch = flash_bwd_probe.launch_variant
def off_by_one_percent(q, k, v, do, lse, delta, dk, dv, config):
    launch(q, k, v, do, lse, delta, dk, dv, config)
    dv.mul_(1.01)
flash_bwd_probe.launch_variant = off_by_one_percent
flash_ab.FWD_BATCH_FIRST = {16: [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1, SPLIT=2)]}
flash_ab.run(16, 3, 1, sys.argv[1] + "/ab.json", {}, device="cpu", batch=2, n=80)
"""


def test_ab_checks_then_times_every_candidate_in_each_round(tmp_path):
    """Every A/B candidate is checked against our kernels and timed once per round; one whose dV is
    1 % off (the probe's dK/dV kernel, patched) is reported and never timed."""
    proc = run(["-c", AB, str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    entry = json.loads((tmp_path / "ab.json").read_text())["d16"]
    assert len(entry["ms"]) == 11
    off = {name for name in entry["ms"] if name.startswith("dkdv probe")}
    assert len(off) == 2
    for name, err in entry["rel_diff_vs_ours"].items():
        assert (err > 5e-3) == (name in off), (name, err)
        assert len(entry["ms"][name]) == (0 if name in off else 3), name
    assert set(entry["fwd_tflops"]) == {name for name in entry["median_ms"] if name.startswith("fwd")}


SPECIALISED = """
import sys
sys.path.insert(0, "bench")
import flash_ab
from lmperf.kernels.flash import triton_backward as tb

def dont(kernel):
    return [p.name for p in kernel.params if p.do_not_specialize]

original, cache = tb.flash_bwd_dq_kernel, {}
assert dont(original) == ["n_queries", "n_keys"], dont(original)
with flash_ab.specialised(tb, "flash_bwd_dq_kernel", cache):
    swapped = tb.flash_bwd_dq_kernel
    assert swapped is not original and swapped.fn is original.fn
    assert dont(swapped) == [], dont(swapped)
assert tb.flash_bwd_dq_kernel is original
print("ok")
"""


def test_ab_specialises_a_kernel_only_inside_the_block():
    """Compiled kernels (not the interpreter's, which this process may hold): a subprocess."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", SPECIALISED], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


AOT = """
import json, sys
sys.path.insert(0, "bench")
import flash_probe_aot as aot
rows = [
    aot.compile_variant("bwd", 128, dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, KV_TMA=True,
                                         DP_FIRST=False, SWAP=True, WS=False)),
    aot.compile_variant("bwd", 64, dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, KV_TMA=True,
                                        DP_FIRST=True, SWAP=False, WS=False)),
    aot.compile_variant("fwd", 128, dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, SPLIT=2, WS=False)),
]
print(json.dumps(rows))
"""


def build_for_hopper(script: str) -> list[dict]:
    """Run an ahead-of-time build script in a compiling (not interpreting) Triton process; its last
    line of output is the JSON list of the binaries' resources."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_probe_variants_build_for_hopper(tmp_path):
    """The compiler rejects what the interpreter accepts (a list held in a variable as a descriptor's
    shape, under Triton 3.6): each probe's kernel builds for sm_90 here, with its resources read off."""
    rows = build_for_hopper(AOT)
    for row in rows:
        assert "error" not in row, row
        assert 0 < row["regs"] <= 255 and row["shared_bytes"] > 0 and row["stack_bytes"] >= 0, row


def test_persistent_passes_equal_our_kernels(tmp_path):
    """bench/flash_sched_probe.py: each pass run persistent, under each schedule, computes every tile
    exactly as our kernel does (ragged lengths, several items per program)."""
    proc = run(["bench/flash_sched_probe.py", "--check-only"], tmp_path)
    rows = rows_of(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # 2 shapes x 3 passes x 3 schedules
    assert len(rows) == 18 and all(r["rel_diff"] == 0.0 for r in rows), rows
    assert {r["variant"] for r in rows} == {f"persistent {s} x1" for s in ("stride", "zigzag", "dynamic")}


SCHED = """
import json, sys
import torch, triton.testing
sys.path.insert(0, "bench")
triton.testing.do_bench = lambda fn, *a, **k: (fn(), 1.0)[1]
import flash_sched_probe as sp
tiles = dict(num_warps=4, num_stages=3)
sp.tuned_configs = lambda inputs: {"fwd": dict(BLOCK_M=32, BLOCK_N=16, **tiles),
                                   "dq": dict(BLOCK_M=32, BLOCK_N=16, **tiles),
                                   "dkdv": dict(BLOCK_M=16, BLOCK_N=32, **tiles)}
launch = sp.launch_dq_persistent
def off_by_one_percent(q, k, v, do, lse, delta, dq, is_causal, config, precision):
    launch(q, k, v, do, lse, delta, dq, is_causal, config, precision)
    if config["SCHEDULE"] == "dynamic":
        dq.mul_(1.01)
sp.launch_dq_persistent = off_by_one_percent
sp.run(16, 2, 1, 1, sys.argv[1] + "/sched.json", {}, device="cpu", batch=2, n=48)
"""


def test_sched_probe_checks_then_times_every_candidate_in_each_round(tmp_path):
    """Every candidate of the scheduling probe is checked against our kernels, then timed once per
    round; one whose dQ is 1 % off (patched) is reported and never timed."""
    proc = run(["-c", SCHED, str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    entry = json.loads((tmp_path / "sched.json").read_text())["d16"]
    # per pass: ours, 3 register limits, one stage fewer with and without the 2 lowest, 3 schedules x 2 waves
    assert len(entry["rel_diff"]) == 3 * 13 and not entry["errors"]
    off = {name for name in entry["rel_diff"] if name.startswith("dq persistent dynamic")}
    assert len(off) == 2
    for name, err in entry["rel_diff"].items():
        assert (err > 5e-3) == (name in off), (name, err)
        assert len(entry["ms"].get(name, [])) == (0 if name in off else 2), name


AOT_SCHED = """
import json, sys
sys.path.insert(0, "bench")
import flash_probe_aot as aot, flash_sched_probe as sp
from lmperf.kernels.flash import triton_backward as tb
common = dict(HEAD_DIM=64, BLOCK_D=64, IS_CAUSAL=True, PRECISION="ieee", USE_TMA=True, SCHEDULE=2)
rows = []
for kernel, tiles in ((sp.fwd_persistent_kernel, dict(BLOCK_M=128, BLOCK_N=64)),
                      (sp.dq_persistent_kernel, dict(BLOCK_M=128, BLOCK_N=64)),
                      (sp.dkdv_persistent_kernel, dict(BLOCK_M=64, BLOCK_N=64, DP_FIRST=True))):
    rows.append(aot.resources(aot.compile_sm90(kernel, {**common, **tiles}, 8 if tiles["BLOCK_M"] == 128 else 4, 3)))
dkdv = dict(HEAD_DIM=64, BLOCK_D=64, IS_CAUSAL=True, PRECISION="ieee", USE_TMA=True, BLOCK_M=64, BLOCK_N=64,
            DP_FIRST=True)
rows.append(aot.resources(aot.compile_sm90(tb.flash_bwd_dkdv_kernel, dkdv, 4, 3, maxnreg=128)))
print(json.dumps(rows))
"""


def test_sched_probe_kernels_build_for_hopper():
    """The persistent kernels (dynamic schedule: a while loop around our tile loops, an atomic counter)
    build for sm_90, and a register limit holds: our dK/dV kernel capped at 128 registers per thread
    uses no more (and spills to the stack instead)."""
    rows = build_for_hopper(AOT_SCHED)
    assert all(0 < row["regs"] <= 255 and row["shared_bytes"] > 0 for row in rows), rows
    assert rows[-1]["regs"] <= 128 and rows[-1]["stack_bytes"] > 0, rows[-1]
