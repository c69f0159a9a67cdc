"""The attention report: the answers' templates follow the facts (one golden text per section), the
figures' legends, and main end to end on committed records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmperf.kinds.attention import facts, figures, report
from lmperf.report.answers import SUMMARY

from .records import plain_oom, record

H100 = Path(__file__).resolve().parents[3] / "results" / "h100" / "attention"
LENGTHS = (4096, 8192, 16384)


def _facts(records):
    return facts.AttentionFacts(facts.frame(records))


def _sweep():
    records = [record("plain", d, n, fwd=n / 400 * d / 16, bwd=n / 130 * d / 16) for d in (16, 64) for n in LENGTHS]
    records += [plain_oom(d, 32768) for d in (16, 64)] + [record("sdpa_cudnn", 16, n, "unsupported") for n in LENGTHS]
    return records + [record("flash", d, n) for d in (16, 64) for n in (*LENGTHS, 32768)]


def test_pytorch_attention_answer_golden():
    assert SUMMARY.sub("", report.attention_answer(_facts(_sweep()), on_cpu=False)) == (
        "Plain attention ran in full up to N = 16384 and ran out of memory first at N = 32768 (in the forward "
        "warm-up), at every head dimension (d = 16, 64); at N = 16384 a forward pass takes 41.0–164 ms and a "
        "backward 126–504 ms (d = 16 to 64). At d = 16, N = 32768 one N×N fp32 matrix is 32 GiB: the forward needs "
        "128 GiB at its peak (four such matrices live at once) and keeps 96.1 GiB in use for backward, on a card of "
        "79.2 GiB. The forward keeps 3 N×N matrices for backward (S, E and P), so that memory grows as N^2.00, ×3.99 "
        "per doubling of N: 24 GiB at N = 16384 (d = 16). A fused kernel removes the N² term: it keeps only O and "
        "one log-sum-exp per row and recomputes P in backward; `flash` keeps 17 MiB at N = 32768 (d = 16, memory ∝ "
        "N^1.00) where plain attention would keep 96 GiB.\n"
    )


def test_where_memory_runs_out_groups_what_reads_the_same_and_names_the_allocators_numbers():
    f = _facts(_sweep() + [record("sdpa", d, n) for d in (16, 64) for n in (*LENGTHS, 32768)])
    assert report.boundary_sentences(f).endswith(
        "`flash` and `sdpa` ran in full up to N = 32768 and never ran out of memory, at every head dimension "
        "(d = 16, 64). Not measured on this device: `sdpa_cudnn` (cannot run here)."
    )
    two = _facts([record("flash", 16, n) for n in LENGTHS] + [record("flash", 64, n) for n in (4096, 8192)])
    assert report.boundary_sentences(two) == (  # no cell ran out of memory: the answer says so, once
        "`flash` ran in full up to N = 16384 at d = 16; ran in full up to N = 8192 at d = 64."
    )
    said = report.accounting_text(f.accounting)
    assert "the first allocation that cannot fit is E = exp(S - max) (32 GiB with 64.1 GiB already live)" in said
    assert "in the forward warm-up, asking for 32 GiB, with 64.1 GiB allocated by PyTorch, 1 MiB reserved" in said


def test_no_cell_running_out_of_memory_is_said_once_and_only_where_none_did():
    cpu = [record(i, d, n, device="cpu") for i in ("plain", "compiled", "flash") for d in (16, 32) for n in LENGTHS]
    for r in cpu:
        r["provenance"]["settings"]["full_passes_up_to"] = 0  # the CPU grid's: every length may stop early
    text = report.section_pytorch_attention(facts.frame(cpu), cpu, _facts(cpu), "cpu")
    assert text.count("ran out of memory") == 1 and "No cell ran out of memory on this CPU." in text
    assert "`plain`, `compiled` and `flash` ran in full up to N = 16384, at every head dimension (d = 16, 32)." in text
    late = [record("plain", 16, n) for n in LENGTHS] + [record("compiled", 16, 32768, "oom", bwd=None, n2=False)]
    answer = report.attention_answer(_facts(late), on_cpu=False)  # plain never ran out, compiled did
    assert "never ran out of memory" in answer and "No cell" not in answer


def test_growth_table_and_method_print_no_empty_ranges_counts_or_lengths():
    records = [record(i, d, n) for i in ("plain", "flash") for d in (16, 64) for n in LENGTHS]
    f = _facts(records)
    rows = report.growth_table(f.growth).set_index("implementation")
    assert rows.loc["flash"].tolist()[:2] == ["1.00", "none"]  # one exponent; O and L only, no N×N matrix
    assert rows.loc["plain", "N×N matrices kept"] == "3.00"
    text = report.section_pytorch_attention(facts.frame(records), records, f, "h100")
    assert "Beyond N = 16384 (the memory boundary's lengths) a phase stops" in text
    for r in records:
        r["provenance"]["settings"]["full_passes_up_to"] = 0
    method = report.section_pytorch_attention(facts.frame(records), records, f, "h100").split("Method", 1)[1]
    assert "N = 0" not in method and "output). A phase stops after at least 2 passes" in method


def test_compiled_and_plain_matrices_are_those_of_the_growth_table():
    """N×N matrices kept: at the largest N that ran in full, in the compile answer as in the growth table."""
    records = [record("plain", 64, n) for n in LENGTHS]
    records += [record("compiled", 64, n, n2=k) for n, k in zip(LENGTHS, (3, 3, 2))]  # the median over pairs: 3
    df = facts.frame(records)
    rows = report.growth_table(facts.AttentionFacts(df).growth).set_index("implementation")["N×N matrices kept"]
    assert rows.to_dict() == {"plain": "3.00", "compiled": "2.00"}
    answer = report.compile_answer(facts.CompileFacts(df))
    assert "Compiled attention keeps 2 N×N matrices for backward where plain keeps 3." in answer


def test_compile_answer_golden():
    records = [record("plain", 64, n, fwd=ms, bwd=3 * ms) for n, ms in ((1024, 1.0), (4096, 2.0))]
    records += [record("compiled", 64, n, n2=2, bwd=1.0) for n in (1024, 4096)]
    assert SUMMARY.sub("", report.compile_answer(facts.CompileFacts(facts.frame(records)))) == (
        "Backward: compiled is faster in 2 (N = 1024–4096) of 2 cells; median speed-up 4.50× (3.00×–6.00×). "
        "Forward: compiled is faster in 1 (N = 4096) and within the noise in 1 of 2 cells; median speed-up 1.50× "
        "(1.00×–2.00×). Compiled attention keeps 2 N×N matrices for backward where plain keeps 3. The first "
        "compiled call took 0.9 s (tracing and compiling), outside every timed pass.\n"
    )


def test_legends_list_only_what_is_drawn(tmp_path):
    df = facts.frame([record("plain", 16, n) for n in (1024, 4096)] + [record("sdpa_cudnn", 16, 1024, "unsupported")])
    labels = figures.memory_figure(df, ["plain", "sdpa_cudnn"], tmp_path / "m.png")
    assert labels == ["plain, predicted", "plain, measured", "card's total memory"]
    df = facts.frame([record(i, 16, n) for i in ("plain", "flash") for n in (1024, 4096)] + [plain_oom(16, 32768)])
    labels = figures.memory_figure(df, ["plain", "flash"], tmp_path / "m.png")
    assert {"fused, predicted", "flash, measured", "plain: out of memory (at plain's prediction)"} <= set(labels)
    assert "plain: out of memory (drawn at the top)" in figures.time_figure(df, ["plain", "flash"], tmp_path / "t.png")
    # compiled ran its forward at N = 32768 and ran out of memory in the backward: marked all the same
    late = [record("compiled", 16, 1024), record("compiled", 16, 32768, "oom", bwd=None, n2=False)]
    labels = figures.time_figure(facts.frame(late), ["compiled"], tmp_path / "t.png")
    assert set(labels) == {"compiled forward", "compiled backward", "compiled: out of memory (drawn at the top)"}
    cpu = facts.frame([record("plain", 16, n, device="cpu") for n in (1024, 4096)])
    assert "card's total memory" not in figures.memory_figure(cpu, ["plain"], tmp_path / "m.png")


def _main(out: Path, device: str, records: list[Path]) -> dict[str, str]:
    assert report.main(["--device", device, "--out", str(out), "--grid", "{}", "--records", *map(str, records)]) == 0
    assert all((out / path).stat().st_size > 0 for path in report.outputs({}))
    return {name: (out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 attention records")
def test_main_on_committed_records_writes_every_output_and_links_what_exists(tmp_path):
    cells = [(i, d, n) for i in ("plain", "compiled", "flash", "sdpa_cudnn") for d in (16, 64) for n in (1024, 32768)]
    texts = _main(tmp_path, "h100", [H100 / f"{i}_fp32_d{d}_n{n}.json" for i, d, n in cells])
    for link in re.findall(r"\]\(\.\./\.\./results/h100/([^)]+)\)", "\n".join(texts.values())):
        assert (tmp_path / link).exists(), link
    texts = {name: SUMMARY.sub("", text) for name, text in texts.items()}  # the front page's one-line answer first
    assert texts["pytorch_attention"].startswith("Plain attention ran in full up to N = 1024 and ran out of memory")
    # two compared cells (N = 1024 at d = 16 and 64; N = 32768 runs out of memory): each counted once
    assert re.match(r"Backward: compiled is [^.]* of 2 cells", texts["torch_compile_a"]), texts["torch_compile_a"]
    assert all("\n\n\n" not in t and t.endswith("\n") and not t.endswith("\n\n") for t in texts.values())


def test_main_on_cpu_records_and_on_none(tmp_path):
    paths = [tmp_path / f"{i}_{n}.json" for i in ("plain", "compiled") for n in (64, 128, 256)]
    for path in paths:
        impl, n = path.stem.split("_")
        path.write_text(json.dumps(record(impl, 16, int(n), device="cpu")))
    joined = "\n".join(_main(tmp_path / "cpu", "cpu", paths).values())
    assert all(word not in joined for word in ("CUDA", "card", "synchronize", "GPU")), joined
    assert set(_main(tmp_path / "none", "h200", []).values()) == {report.NOT_MEASURED}
