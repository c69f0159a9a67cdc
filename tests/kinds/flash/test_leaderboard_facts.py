"""leaderboard facts: ours against SDPA flash and cuDNN, verdicts from the intervals; the course's best
entry only as a reference; how our tiles were chosen."""

from __future__ import annotations

import pytest

from lmperf.kinds.flash import leaderboard_report
from lmperf.kinds.flash.leaderboard_facts import leaderboard_facts, tiles_sentence

from .builders import leaderboard


def _verdicts(**kwargs):
    facts = leaderboard_facts(leaderboard(**kwargs), "h100")
    return {t.implementation: t.verdict for t in facts.timings if t.head_dim == 64 and t.verdict}


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
    facts = leaderboard_facts(leaderboard(), "h100")
    flash = facts.at("sdpa_flash")
    assert flash.verdict == "faster" and flash.ours_over_it.median == pytest.approx(4.75 / 7.02)
    assert facts.ours.time.median == 4.75 and facts.ours.verdict is None


def test_the_course_figure_is_a_reference_not_a_verdict():
    facts = leaderboard_facts(leaderboard(ours=6.0), "h100")
    text = leaderboard_report.section(facts, "h100", "")
    assert "the course's published best verified entry is 5.364 ms on an H100 (the course's figure" in text
    assert "5.364" not in leaderboard_report.answer(facts) and "that time" not in text
    missing = leaderboard_report.section(None, "cpu", "", " (unsupported: no CUDA device)")
    assert missing == "The leaderboard configuration was not measured on `cpu` (unsupported: no CUDA device).\n"


def test_leaderboard_says_how_our_tiles_were_chosen():
    tuned = {"first_runs": {"tuning_s": 95.7, "tile_sources": {"committed": 0, "tuned": 6, "candidates_failed": 0}}}
    text = tiles_sentence(tuned)
    assert "6 tuned in the run" in text and "tuning took 95.7 s before timing, not part of the times" in text
    remembered = {"first_runs": {"tuning_s": 0.0, "tile_sources": {"committed": 6, "tuned": 0}}}
    text = tiles_sentence(remembered)
    assert "6 remembered for this device" in text and "tuning took" not in text
    assert tiles_sentence({}) == ""


def test_answer_golden():
    facts = leaderboard_facts(leaderboard(spread=0.01, trials=5), "h100")
    assert leaderboard_report.answer(facts) == (
        "Our FlashAttention-2 takes 4.750 ms [4.702, 4.798] for the leaderboard's forward+backward "
        "(torch.compile, bf16, causal, Q, K, V of shape (16, 16384, 64)) on NVIDIA H100 80GB HBM3: faster than "
        "SDPA flash (7.020 ms [6.950, 7.090]; ours / it = 0.677× [0.663, 0.690]) and slower than SDPA cuDNN "
        "(4.510 ms [4.465, 4.555]; ours / it = 1.053× [1.032, 1.074])."
    )
