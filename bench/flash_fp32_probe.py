# ruff: noqa: B023 (each lambda runs before its loop variables change)
"""Probe (one GPU, ~10 min): our kernels on float32 inputs with IEEE, 3xTF32 and TF32 products.

Relative error against float64 (B=2, N=1024, not causal; SDPA fp32 beside) and forward/backward
TFLOP/s at the attention sweep's shape (B=8, N=4096), heuristic tiles and tuned ones.
PROBE_D (head dims, default 64,128) and PROBE_MODES (default ieee,tf32x3,tf32) narrow it.
Usage: python bench/flash_fp32_probe.py  (writes $OUT/fp32_probe.json or ./fp32_probe.json)
"""

import json
import os
import sys
import tempfile
import time

import torch
from triton.testing import do_bench

os.environ["LMPERF_CACHE_DIR"] = tempfile.mkdtemp()
from lmperf.flash import triton_backward, triton_forward, tuning  # noqa: E402

out = {}


def set_mode(mode):
    f = lambda dtype, tf32=None: mode if dtype == torch.float32 else "ieee"  # noqa: E731
    triton_forward.dot_precision = f
    triton_backward.dot_precision = f
    tuning.forget()


def err(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def reference(q, k, v, do, causal):
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ v
    o.backward(do.double())
    return o.detach(), q.grad, k.grad, v.grad


extra = {
    "fwd": [tuning._c(32, 32, 2, 1), tuning._c(16, 16, 1, 1), tuning._c(32, 16, 2, 2), tuning._c(64, 16, 4, 2)],
    "dkdv": [tuning._c(16, 32, 2, 1), tuning._c(16, 16, 1, 1), tuning._c(16, 64, 4, 2), tuning._c(32, 32, 4, 2)],
    "dq": [tuning._c(32, 16, 2, 1), tuning._c(16, 16, 1, 1), tuning._c(64, 16, 4, 2), tuning._c(32, 32, 4, 2)],
}
for kname, cs in extra.items():
    tuning.CANDIDATES[kname].extend(cs)

for causal in (False,):
    for d in [int(x) for x in os.environ.get("PROBE_D", "64,128").split(",")]:
        torch.manual_seed(0)
        B, N = 2, 1024
        q, k, v, do = (torch.randn(B, N, d, device="cuda") for _ in range(4))
        ref = reference(q, k, v, do, causal)
        # SDPA fp32 (efficient backend picks itself)
        qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
        os_ = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        os_.backward(do)
        out[f"sdpa_err_d{d}"] = [err(os_, ref[0]), err(qs.grad, ref[1]), err(ks.grad, ref[2]), err(vs.grad, ref[3])]
        for mode in ("ieee", "tf32x3", "tf32"):
            set_mode(mode)
            try:
                o, lse = triton_forward.flash_forward(q, k, v, causal)
                dq, dk, dv = triton_backward.flash_backward(q, k, v, o, lse, do, causal)
                out[f"{mode}_err_d{d}"] = [err(o, ref[0]), err(dq, ref[1]), err(dk, ref[2]), err(dv, ref[3])]
            except Exception as e:  # noqa: BLE001
                out[f"{mode}_err_d{d}"] = repr(e)[:300]
            print(json.dumps({k2: v2 for k2, v2 in out.items() if k2.endswith(f"d{d}")}), flush=True)
        # speed at the attention sweep's shape
        B, N = 8, 4096
        q, k, v, do = (torch.randn(B, N, d, device="cuda") for _ in range(4))
        fl = 4 * B * N * N * d
        for mode in os.environ.get("PROBE_MODES", "ieee,tf32x3,tf32").split(","):
            set_mode(mode)
            for pol in ("off", "missing") if mode != "tf32" else ("off",):
                tuning.forget()
                tuning.set_policy(pol)
                t0 = time.perf_counter()
                try:
                    o, lse = triton_forward.flash_forward(q, k, v, causal)
                    triton_backward.flash_backward(q, k, v, o, lse, do, causal)
                    first = time.perf_counter() - t0
                    fms = do_bench(lambda: triton_forward.flash_forward(q, k, v, causal), warmup=20, rep=200)
                    bms = do_bench(
                        lambda: triton_backward.flash_backward(q, k, v, o, lse, do, causal), warmup=20, rep=200
                    )
                    res = {
                        "first_s": round(first, 1),
                        "fwd_ms": fms,
                        "bwd_ms": bms,
                        "fwd_tflops": fl / fms / 1e9,
                        "bwd_tflops": 2.5 * fl / bms / 1e9,
                        "tiles": {kk: vv["config"] for kk, vv in tuning.LAST.items()},
                    }
                    if pol == "missing":
                        res["candidates"] = {
                            kk.split(":")[1]: vv["candidates"] for kk, vv in tuning._tuned_here.items()
                        }
                except Exception as e:  # noqa: BLE001
                    res = repr(e)[:300]
                out[f"{mode}_{pol}_speed_d{d}"] = res
                print(f"{mode} {pol} d{d}", json.dumps(res)[:600], flush=True)
        tuning.set_policy(None)
        # SDPA fp32 speed
        qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
        fms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs), warmup=20, rep=200)
        os_ = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
        bms = do_bench(lambda: torch.autograd.grad(os_, (qs, ks, vs), do, retain_graph=True), warmup=20, rep=200)
        out[f"sdpa_speed_d{d}"] = {"fwd_tflops": fl / fms / 1e9, "bwd_tflops": 2.5 * fl / bms / 1e9}
        print("sdpa", d, out[f"sdpa_speed_d{d}"], flush=True)

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fp32_probe.json"), "w"), indent=1)
print("done", file=sys.stderr)
