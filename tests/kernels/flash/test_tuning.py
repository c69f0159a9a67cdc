"""lmperf.kernels.flash.tuning without a GPU: bucket keys, the heuristic, the committed table and the user cache.

The choosing itself (tuning on a miss, remembered) runs on GPU in test_triton.py.
"""

import json

import pytest
import torch

triton = pytest.importorskip("triton")

from lmperf.kernels.flash import tuning  # noqa: E402


def test_keys_ignore_batch_and_exact_lengths():
    key = tuning.bucket_key("fwd", "bf16", 80, True, 1000, 900)
    assert key == "fwd|bf16|d128|causal|n1024"
    # same bucket: head dims padded to the same tile width, lengths up to the same power of two
    assert tuning.bucket_key("fwd", "bf16", 96, True, 513, 1024) == key
    assert tuning.bucket_key("fwd", "bf16", 64, True, 1000, 900) != key
    assert tuning.bucket_key("fwd", "bf16", 80, True, 1025, 900) != key
    assert tuning.length_bucket(1, 1) == tuning.MIN_BUCKET and tuning.length_bucket(10**6, 1) == tuning.MAX_BUCKET
    assert tuning.precision_name(torch.float32, "tf32x3") == "fp32"
    assert tuning.precision_name(torch.float32, "ieee") == "fp32ieee"
    assert tuning.precision_name(torch.float32, "tf32") == "tf32"
    assert tuning.precision_name(torch.bfloat16, "ieee") == "bf16"


@pytest.mark.parametrize("head_dim", [16, 48, 80, 128, 160, 256])
@pytest.mark.parametrize(
    "dtype, precision",
    [(torch.float32, "fp32"), (torch.float32, "fp32ieee"), (torch.float32, "tf32"), (torch.bfloat16, "bf16")],
)
def test_heuristic_fits_shared_memory_and_the_causal_split(head_dim, dtype, precision):
    itemsize = torch.empty((), dtype=dtype).element_size()
    for kernel in tuning.KERNELS:
        config = tuning.heuristic(kernel, head_dim, dtype, 4096, precision)
        assert tuning.shared_bytes(kernel, config, head_dim, itemsize) <= tuning.HEURISTIC_SHARED_BYTES
        assert not config.get("USE_TMA") and not config.get("WARP_SPECIALIZE")  # untested variants: tuned only
        big, small = (
            (config["BLOCK_N"], config["BLOCK_M"]) if kernel == "dkdv" else (config["BLOCK_M"], config["BLOCK_N"])
        )
        assert big % small == 0


@pytest.fixture
def caches(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "TUNED_DIR", tmp_path / "committed")
    monkeypatch.setenv("LMPERF_CACHE_DIR", str(tmp_path / "user"))
    tuning.forget()
    yield tmp_path
    tuning.forget()


def _table(version, config):
    return {"device": "h100", "triton": version, "choices": {"fwd|bf16|d64|causal|n16384": {"config": config}}}


def test_committed_table_only_for_its_triton_and_user_cache_wins(caches):
    key = "h100:fwd|bf16|d64|causal|n16384"
    committed = tuning.committed_path("h100")
    committed.parent.mkdir(parents=True)
    committed.write_text(json.dumps(_table("0.0.0-other", {"BLOCK_M": 1})))
    tuning._load("h100")
    assert key not in tuning._memory  # tuned by another Triton: not used
    tuning.forget()
    committed.write_text(json.dumps(_table(triton.__version__, {"BLOCK_M": 2})))
    tuning._load("h100")
    assert tuning._memory[key] == {"config": {"BLOCK_M": 2}, "source": "committed"}
    tuning.forget()
    tuning._remember("h100", "fwd|bf16|d64|causal|n16384", {"config": {"BLOCK_M": 3}})
    assert json.loads(tuning.user_cache_path("h100").read_text())["triton"] == triton.__version__
    tuning.forget()
    tuning._load("h100")
    assert tuning._memory[key] == {"config": {"BLOCK_M": 3}, "source": "user_cache"}


def test_policy_from_environment_and_setter(monkeypatch):
    monkeypatch.setenv("LMPERF_FLASH_TUNE", "missing")
    assert tuning.policy() == "missing"
    with tuning.tuning_policy("off"):
        assert tuning.policy() == "off"
    assert tuning.policy() == "missing"
    monkeypatch.setenv("LMPERF_FLASH_TUNE", "always")
    with pytest.raises(ValueError, match="LMPERF_FLASH_TUNE"):
        tuning.policy()


def test_committed_tables_are_well_formed():
    tables = sorted(tuning.TUNED_DIR.glob("*.json"))
    assert tables, "no committed table"
    for path in tables:
        table = json.loads(path.read_text())
        assert table["triton"] and table["device"] == path.stem
        for key, entry in table["choices"].items():
            kernel, precision, d, causal, n = key.split("|")
            assert kernel in tuning.KERNELS and precision in ("fp32", "fp32ieee", "tf32", "bf16", "fp16")
            assert causal in ("causal", "full") and int(d[1:]) in (16, 32, 64, 128, 256) and int(n[1:]) >= 128
            names = {json.dumps(c, sort_keys=True) for c in tuning.CANDIDATES[kernel]}
            assert json.dumps(entry["config"], sort_keys=True) in names
            assert entry["ms"] == min(v for v in entry["candidates"].values() if isinstance(v, float))


def test_planned_is_what_choose_gives_untuned(caches, monkeypatch):
    """`planned` (no tensors, no launch) against `choose` on real tensors, policy off: the remembered
    choice where there is one, else the heuristic of the launch's precision, for every kernel."""
    monkeypatch.setattr(tuning, "device_slug", lambda device=None: "h100")
    monkeypatch.setattr(tuning, "INTERPRETED", False)
    committed = tuning.committed_path("h100")
    committed.parent.mkdir(parents=True)
    remembered = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    committed.write_text(json.dumps(_table(triton.__version__, remembered)))  # fwd, bf16, d 64, causal, n16384
    cases = [
        (torch.bfloat16, "ieee", 64, True, 9000, 16384),  # the remembered bucket
        (torch.bfloat16, "ieee", 64, True, 1000, 1000),  # another bucket: the heuristic
        (torch.float32, "tf32x3", 80, False, 777, 2049),  # fp32 products: the fp32 tiles
        (torch.float32, "tf32", 256, True, 100, 300),
    ]
    for dtype, precision, d, causal, n_q, n_k in cases:
        q, k = torch.empty(2, n_q, d, dtype=dtype), torch.empty(2, n_k, d, dtype=dtype)
        for kernel in tuning.KERNELS:
            tuning.forget()  # `choose` remembers its heuristic choices: each comparison from scratch
            want = tuning.choose(kernel, q, k, causal, precision, launch=None, outputs=())
            tuning.forget()
            assert tuning.planned(kernel, dtype, precision, d, causal, n_q, n_k, "h100") == want
    assert tuning.planned("fwd", torch.bfloat16, "ieee", 64, True, 9000, 16384, "h100") == remembered
    prec = tuning.precision_name(torch.float32, "tf32x3")
    assert tuning.planned("dq", torch.float32, "tf32x3", 80, False, 777, 2049, "h100") == tuning.heuristic(
        "dq", 80, torch.float32, 4096, prec
    )
