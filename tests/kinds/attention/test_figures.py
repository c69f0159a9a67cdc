"""The figures' legends list only what is drawn (issue 52: the attention-memory legend listed lines not shown)."""

from __future__ import annotations

from lmperf.kinds.attention import compiled, facts, figures

from .report_records import plain_oom, record

LENGTHS = (1024, 4096)


def _frame(records):
    df = facts.frame(records)
    return df, facts.implementations(df, ("plain", "compiled", "sdpa", "flash", "sdpa_cudnn"))


def test_an_implementation_with_nothing_drawn_is_not_in_any_legend(tmp_path):
    records = [record("plain", 16, n) for n in LENGTHS]
    records += [record("sdpa_cudnn", 16, n, "unsupported") for n in LENGTHS]
    df, impls = _frame(records)  # the grid names compiled, sdpa and flash too: no records of them
    for labels in (
        figures.time_figure(df, impls, tmp_path / "t.png"),
        figures.memory_figure(df, impls, tmp_path / "m.png"),
    ):
        assert labels and all(label.startswith(("plain", "card")) for label in labels), labels
    memory = figures.memory_figure(df, impls, tmp_path / "m.png")
    # no fused kernel measured: no fused prediction; no out-of-memory cell: no out-of-memory marker
    assert memory == ["plain, predicted", "plain, measured", "card's total memory"]
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_out_of_memory_markers_and_fused_lines_appear_when_there_is_something_to_draw(tmp_path):
    records = [record(i, 16, n) for i in ("plain", "flash") for n in LENGTHS] + [plain_oom(16, 32768)]
    df, impls = _frame(records)
    memory = figures.memory_figure(df, impls, tmp_path / "m.png")
    assert "fused, predicted" in memory and "flash, measured" in memory
    assert "plain: out of memory (at plain's prediction)" in memory
    assert "plain: out of memory (drawn at the top)" in figures.time_figure(df, impls, tmp_path / "t.png")


def test_a_cpu_figure_has_no_card_line(tmp_path):
    df, impls = _frame([record("plain", 16, n, device="cpu") for n in LENGTHS])
    assert "card's total memory" not in figures.memory_figure(df, impls, tmp_path / "m.png")


def test_figures_with_nothing_to_draw_are_still_written(tmp_path):
    df, impls = _frame([])
    assert figures.time_figure(df, impls, tmp_path / "t.png") == []
    assert figures.memory_figure(df, impls, tmp_path / "m.png") == []
    assert figures.compile_figure(compiled.compile_frame(df), tmp_path / "c.png") == []
    assert all((tmp_path / f"{name}.png").exists() for name in "tmc")


def test_compile_figure_labels_each_drawn_phase(tmp_path):
    records = [record(i, 16, n) for i in ("plain", "compiled") for n in LENGTHS]
    labels = figures.compile_figure(compiled.compile_frame(facts.frame(records)), tmp_path / "c.png")
    assert labels == ["d = 16 forward", "d = 16 backward", "as fast as plain"]
