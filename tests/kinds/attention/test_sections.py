"""The pytorch_attention templates: what they say follows the facts (one golden text for the answer)."""

from __future__ import annotations

from lmperf.kinds.attention import facts, sections

from .report_records import plain_oom, record

LENGTHS = (4096, 8192, 16384)


def _facts(records, grid=None, device="h100"):
    return facts.attention_facts(facts.frame(records), records, grid or {}, device)


def _gpu_sweep():
    records = [record("plain", d, n, fwd=n / 400 * d / 16, bwd=n / 130 * d / 16) for d in (16, 64) for n in LENGTHS]
    records += [plain_oom(d, 32768) for d in (16, 64)]
    records += [record("flash", d, n) for d in (16, 64) for n in (*LENGTHS, 32768)]
    return records


def test_pytorch_attention_answer_golden():
    assert sections.attention_answer(_facts(_gpu_sweep())) == (
        "Plain attention ran in full up to N = 16384 and ran out of memory first at N = 32768 (in the forward "
        "warm-up), at every head dimension (d = 16, 64); at N = 16384 a forward pass takes 41.0–164 ms and a "
        "backward 126–504 ms (d = 16 to 64). At d = 16, N = 32768 one N×N fp32 matrix is 32 GiB, and the forward "
        "needs 128 GiB at its peak (four such matrices live at once) against the card's 79.2 GiB; the allocator "
        "refused a 32 GiB request in the forward warm-up with 64.1 GiB already allocated. The forward keeps 3 N×N "
        "matrices for backward (S, E and P), so that memory grows as N^2.00, ×3.99 per doubling of N: 24 GiB at "
        "N = 16384 (d = 16). A fused kernel removes the N² term: it keeps only O and one log-sum-exp per row and "
        "recomputes P in backward; `flash` keeps 17 MiB at N = 32768 (d = 16, memory ∝ N^1.00) where plain "
        "attention would keep 96 GiB."
    )


def test_a_forward_that_fits_the_card_is_not_said_to_need_more_than_it():
    # a 140 GiB card: the forward's 128 GiB peak fits, the backward warm-up runs out
    big = {"device_total_memory_mib": 143_156.0}
    records = [record("plain", 16, 16384), plain_oom(16, 32768, "backward warm-up", **big)]
    f = _facts(records)
    assert f.accounting.first_failure is None
    answer = sections.attention_answer(f)
    assert "the forward fits the card's 140 GiB (128 GiB at its peak) but keeps 96.1 GiB in use for backward" in answer
    assert "against the card's" not in answer
    assert "Predicted: the whole forward fits on the card" in sections.accounting_measured(f.accounting)


def test_every_head_dimension_is_said_only_when_every_one_reads_the_same():
    text = sections.boundary_sentences(_facts(_gpu_sweep()))
    assert "`plain` ran in full up to N = 16384 and ran out of memory first at N = 32768 (in the forward " in text
    assert "`flash` ran in full up to N = 32768 and never ran out of memory, at every head dimension" in text
    # flash ran d = 64 only up to 8192: each head dim is named, and the rest is not measured, not "never OOM"
    records = [record("flash", 16, n) for n in LENGTHS] + [record("flash", 64, n) for n in (4096, 8192)]
    text = sections.boundary_sentences(_facts(records, {"head_dims": [16, 64], "sequence_lengths": list(LENGTHS)}))
    assert "every head dimension" not in text
    assert "ran in full up to N = 16384 and never ran out of memory at d = 16" in text
    assert "`flash` has no record yet at d = 64, N = 16384 (not measured, so not counted as out of memory)." in text


def test_implementations_that_read_the_same_share_one_sentence_and_unsupported_ones_one_line():
    records = [record(i, 16, n) for i in ("flash", "sdpa") for n in LENGTHS]
    records += [record("sdpa_cudnn", 16, n, "unsupported") for n in LENGTHS]
    text = sections.boundary_sentences(_facts(records))
    assert text == (
        "`flash` and `sdpa` ran in full up to N = 16384 and never ran out of memory, at every head dimension "
        "(d = 16). Not measured on this device: `sdpa_cudnn` (cannot run here)."
    )


def test_the_memory_note_leaves_out_what_the_process_held_before_the_cell():
    records = [record("plain", 16, n, held_mib=h) for n, h in zip(LENGTHS, (0.0, 32.0, 64.0))]
    note = sections.memory_note(_facts(records))
    assert "counts this cell's own tensors: Q, K, V and dO" in note
    assert "already held up to 64 MiB before each cell" in note and "left out" in note
    # on a CPU nothing is held: the note says where kept memory comes from instead
    cpu = sections.memory_note(_facts([record("plain", 16, n, device="cpu") for n in LENGTHS], device="cpu"))
    assert "saved_tensors_hooks" in cpu and "held" not in cpu


def test_no_oom_on_a_cpu_is_one_sentence_without_a_card():
    f = _facts([record("plain", 16, n, device="cpu") for n in LENGTHS], device="cpu")
    assert "No cell ran out of memory on this CPU." in sections.attention_answer(f)
    assert "card" not in sections.attention_answer(f)


def test_the_accounting_names_the_first_allocation_that_cannot_fit_and_the_allocators_numbers():
    acc = _facts(_gpu_sweep()).accounting
    text = sections.accounting_measured(acc)
    assert "the first allocation that cannot fit is E = exp(S - max) (32 GiB with 64.1 GiB already live)" in text
    assert "out of memory in the forward warm-up, asking for 32 GiB, with 64.1 GiB allocated by PyTorch" in text
    assert "1 MiB reserved but unallocated" in text


def test_head_dim_and_left_out_sentences():
    records = [record("plain", d, n) for d in (16, 128) for n in LENGTHS]
    records += [record("compiled", 16, n, n2=2) for n in LENGTHS]
    records.append(record("compiled", 16, 32768, "oom", n2=2, bwd=None, oom_phase="backward warm-up"))
    text = sections.growth_sentences(_facts(records))
    assert "Left out of the fits although the forward's kept memory was measured: `compiled` at N = 32768 for " in text
    assert "At N = 16384, d = 128 keeps 1.00× what d = 16 keeps" in text
    assert "`torch.compile` keeps 2 N×N matrices: fewer than plain, growing the same way (N^2.00)." in text
