"""leaderboard: ours against SDPA flash and cuDNN, verdicts from the intervals of merged trials; the
course's best entry only as a reference; records from before the top-level times still read."""

from __future__ import annotations

import pytest

from lmperf.kinds.flash import leaderboard_report
from lmperf.kinds.flash.leaderboard_report import LeaderboardFacts

from .builders import leaderboard


def _verdicts(**kwargs):
    facts = LeaderboardFacts(leaderboard(**kwargs), "h100")
    return {t.implementation: t.verdict for t in facts.timings if t.verdict}


@pytest.mark.parametrize(
    ("cudnn", "spread", "trials", "verdict"),
    [
        (4.51, None, 1, "within noise"),  # one trial: a 5% gap is inside twice the margin
        (4.51, 0.01, 5, "slower"),  # tight intervals: the same gap is beyond the noise
        (4.51, 0.1, 5, "within noise"),  # overlapping intervals
        (6.0, None, 1, "faster"),
    ],
)
def test_ours_against_cudnn_follows_the_intervals(cudnn, spread, trials, verdict):
    assert _verdicts(cudnn=cudnn, spread=spread, trials=trials)["sdpa_cudnn"] == verdict


def test_ours_faster_than_sdpa_flash_and_the_ratio_is_ours_over_it():
    facts = LeaderboardFacts(leaderboard(), "h100")
    flash = facts.at("sdpa_flash")
    assert flash.verdict == "faster" and flash.ours_over_it.median == pytest.approx(4.75 / 7.02)
    assert facts.at("flash").time.median == 4.75 and facts.at("flash").verdict is None


def test_a_record_without_top_level_times_reads_the_protocol():
    record = leaderboard()
    for impl in ("flash", "sdpa_flash", "sdpa_cudnn"):
        del record["metrics"][f"{impl}_d64_forward_backward_ms_median"]
    record["metrics"]["protocol_by_head_dim"]["64"]["ratio_flash_over_sdpa_flash"] = 0.68  # older records' ratios
    facts = LeaderboardFacts(record, "h100")
    assert [t.implementation for t in facts.timings] == ["flash", "sdpa_flash", "sdpa_cudnn"]
    assert facts.at("sdpa_cudnn").time.median == 4.51


def test_the_course_figure_is_a_reference_not_a_verdict():
    record = leaderboard(ours=6.0)
    text = leaderboard_report.section([record], "h100")
    assert "the course's published best verified entry is 5.364 ms on an H100 (the course's figure" in text
    assert "5.364" not in leaderboard_report.answer(LeaderboardFacts(record, "h100"))
    record["status"], record["reason"] = "unsupported", "no CUDA device"
    missing = leaderboard_report.section([record], "cpu")
    assert missing == "The leaderboard configuration was not measured on `cpu` (unsupported: no CUDA device).\n"


def test_answer_golden():
    facts = LeaderboardFacts(leaderboard(spread=0.01, trials=5), "h100")
    assert leaderboard_report.answer(facts) == (
        "Our FlashAttention-2 takes 4.750 ms [4.702, 4.798] for the leaderboard's forward+backward "
        "(torch.compile, bf16, causal, Q, K, V of shape (16, 16384, 64)) on NVIDIA H100 80GB HBM3: faster than "
        "SDPA flash (7.020 ms [6.950, 7.090]; ours / it = 0.677× [0.663, 0.690]) and slower than SDPA cuDNN "
        "(4.510 ms [4.465, 4.555]; ours / it = 1.053× [1.032, 1.074])."
    )
