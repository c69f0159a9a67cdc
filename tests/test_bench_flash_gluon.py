"""bench/flash_gluon_fwd.py on CPU: its Gluon kernels build for sm_90 and its launchers refuse what they
cannot run, before a probe spends GPU time (Gluon has no interpreter: correctness is checked on the GPU,
against our Triton forward, by the probe itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

BUILD = """
import json, sys
sys.path.insert(0, "bench")
import flash_gluon_fwd as g
rows = [
    g.compile_only(64, 64, 3, block_m=128, num_warps=8),
    g.compile_only(128, 64, 3, consumer_regs=240),
    g.compile_only(64, 128, 3, consumer_regs=240, pingpong=True),
]
print(json.dumps(rows))
"""


def test_gluon_kernels_build_for_hopper():
    """The single-warpgroup kernel and the warp-specialised one (with and without ping-pong): no spills,
    and the ring of key/value stages sized as asked (STAGES x 2 tiles of bf16, plus the query tile)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", BUILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain, ws, pingpong = json.loads(proc.stdout.strip().splitlines()[-1])
    for row, (d, block_n, rows_q) in zip((plain, ws, pingpong), ((64, 64, 128), (128, 64, 128), (64, 128, 128))):
        assert 0 < row["regs"] <= 255 and row["stack_bytes"] == 0, row
        tiles_bytes = (3 * 2 * block_n + rows_q) * d * 2
        assert tiles_bytes <= row["shared_bytes"] < tiles_bytes + 2048, row
    # the warp-specialised kernels run at the kernel-wide limit that leaves 240 to each consumer
    assert ws["regs"] == pingpong["regs"] == 168


@pytest.mark.parametrize("consumer_regs", [232, 240])
def test_ws_register_limit_leaves_the_consumers_their_share(consumer_regs):
    """12 warps (two consumer warpgroups and the loader's warpgroup at 24) within an SM's 65,536."""
    import flash_gluon_fwd as g

    limit = g.ws_maxnreg(consumer_regs)
    assert limit % 8 == 0
    assert 3 * limit >= 2 * consumer_regs + 24
    assert limit * 12 * 32 <= 65536


def test_launchers_refuse_what_the_kernels_do_not_handle():
    import flash_gluon_fwd as g

    q = torch.zeros(1, 256, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of block_n"):
        g.attention_forward(q, q, q, True, block_m=64, block_n=128)
    with pytest.raises(ValueError, match="probe limits"):
        g.attention_forward(q.float(), q.float(), q.float(), True)
    with pytest.raises(ValueError, match="probe limits"):
        g.attention_forward_ws(q[:, :200], q[:, :200], q[:, :200], True)
    with pytest.raises(ValueError, match="probe limits"):
        g.attention_forward_ws(torch.zeros(1, 256, 80, dtype=torch.bfloat16), q, q, True)
