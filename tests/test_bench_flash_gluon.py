"""bench/flash_gluon_fwd.py and flash_gluon_bwd.py on CPU: their Gluon kernels build for sm_90 and their
launchers refuse what they cannot run, before a probe spends GPU time (Gluon has no interpreter:
correctness is checked on the GPU, against our Triton kernels, by the probes themselves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

BUILD = """
import json, sys
sys.path.insert(0, "bench")
import flash_gluon_fwd as g, flash_gluon_bwd as b
rows = [
    g.compile_only(64, 64, 3, block_m=128, num_warps=8),
    g.compile_only(128, 64, 3, consumer_regs=240),
    g.compile_only(64, 128, 3, consumer_regs=240, pingpong=True),
    b.compile_only(64, 2),
]
print(json.dumps(rows))
"""


def test_gluon_kernels_build_for_hopper():
    """The forward's single-warpgroup kernel and warp-specialised one (with and without ping-pong), and
    the warp-specialised dK/dV pass: no spills, and shared memory sized as asked (the ring's STAGES x 2
    tiles of bf16 plus the tiles each CTA keeps)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", BUILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain, ws, pingpong, dkdv = json.loads(proc.stdout.strip().splitlines()[-1])
    for row, (d, block_n, rows_q) in zip((plain, ws, pingpong), ((64, 64, 128), (128, 64, 128), (64, 128, 128))):
        assert 0 < row["regs"] <= 255 and row["stack_bytes"] == 0, row
        tiles_bytes = (3 * 2 * block_n + rows_q) * d * 2
        assert tiles_bytes <= row["shared_bytes"] < tiles_bytes + 2048, row
    # the warp-specialised kernels run at the kernel-wide limit that leaves 240 to each consumer
    assert ws["regs"] == pingpong["regs"] == dkdv["regs"] == 168
    # dK/dV at d = 64: K and V of 128 keys, and 2 stages of Q and dO tiles of 64 rows
    tiles_bytes = (2 * 128 + 2 * 2 * 64) * 64 * 2
    assert dkdv["stack_bytes"] == 0 and tiles_bytes <= dkdv["shared_bytes"] < tiles_bytes + 2048, dkdv


@pytest.mark.parametrize("consumer_regs", [232, 240])
def test_ws_register_limit_leaves_the_consumers_their_share(consumer_regs, bench_module):
    """12 warps (two consumer warpgroups and the loader's warpgroup at 24) within an SM's 65,536."""
    g = bench_module("flash_gluon_fwd")

    limit = g.ws_maxnreg(consumer_regs)
    assert limit % 8 == 0
    assert 3 * limit >= 2 * consumer_regs + 24
    assert limit * 12 * 32 <= 65536


def test_launchers_refuse_what_the_kernels_do_not_handle(bench_module):
    g = bench_module("flash_gluon_fwd")

    q = torch.zeros(1, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of block_n"):
        g.attention_forward(q, q, q, True, block_m=64, block_n=128)
    with pytest.raises(ValueError, match="probe limits"):
        g.attention_forward(q.float(), q.float(), q.float(), True)
    with pytest.raises(ValueError, match="probe limits"):
        g.attention_forward_ws(q[:, :200], q[:, :200], q[:, :200], True)
    with pytest.raises(ValueError, match="probe limits"):
        g.attention_forward_ws(torch.zeros(1, 256, 80, dtype=torch.bfloat16), q, q, True)

    b = bench_module("flash_gluon_bwd")
    lse = torch.zeros(1, 256)
    with pytest.raises(ValueError, match="probe limits"):
        b.dkdv(q[:, :192], q[:, :192], q[:, :192], q[:, :192], lse, lse)
    with pytest.raises(ValueError, match="probe limits"):
        b.dkdv(q, q, q, q.float(), lse, lse)
