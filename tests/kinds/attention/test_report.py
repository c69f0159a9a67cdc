"""The report end to end: committed H100 records in, every declared output and section out, every
figure referenced; a device without records; the fp32 product labels of fused rows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmperf.kinds.attention import report

from .report_records import record

REPO = Path(__file__).resolve().parents[3]
H100 = REPO / "results" / "h100" / "attention"
GRID = {
    "implementations": ["plain", "compiled", "sdpa", "flash", "sdpa_cudnn"],
    "head_dims": [16, 64],
    "sequence_lengths": [1024, 16384, 32768],
}


def _run(out: Path, records: list[Path], device: str = "h100", grid: dict = GRID) -> dict[str, str]:
    argv = ["--device", device, "--out", str(out), "--grid", json.dumps(grid), "--records", *map(str, records)]
    assert report.main(argv) == 0
    return {name: (out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 attention records")
def test_main_on_committed_records_writes_every_output_and_references_every_figure(tmp_path):
    records = [
        H100 / f"{impl}_fp32_d{d}_n{n}.json"
        for impl in ("plain", "compiled", "flash", "sdpa_cudnn")
        for d in GRID["head_dims"]
        for n in GRID["sequence_lengths"]
    ]
    texts = _run(tmp_path, records)
    for path in report.outputs(GRID):
        assert (tmp_path / path).stat().st_size > 0, path
    joined = "\n".join(texts.values())
    for figure in (tmp_path / "figures").glob("*.png"):
        assert f"](../../results/h100/figures/{figure.name})" in joined, figure.name
    for link in re.findall(r"\]\((\.\./\.\./results/[^)]+)\)", joined):
        assert (tmp_path / link.removeprefix("../../results/h100/")).exists(), link
    text = texts["pytorch_attention"]
    # the answer comes first, then its table; the held memory is named and left out
    assert text.startswith("Plain attention ran in full up to N = 16384 and ran out of memory first at N = 32768")
    assert re.search(r"already held (up to )?64 MiB before each cell \(.*\), left out", text)
    assert "`sdpa_cudnn` (cuDNN attention does not take torch.float32" in text
    for text in texts.values():
        assert "\n\n\n" not in text and text.endswith("\n") and not text.endswith("\n\n")


def test_a_device_without_records_still_writes_every_output(tmp_path):
    texts = _run(tmp_path, [], device="h200")
    for path in report.outputs({}):
        assert (tmp_path / path).exists(), path
    assert all(t == report.NOT_MEASURED for t in texts.values())


def test_cpu_records_use_words_true_of_a_cpu(tmp_path):
    paths = []
    for impl in ("plain", "compiled"):
        for n in (64, 128, 256):
            path = tmp_path / "records" / f"{impl}_fp32_d16_n{n}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(record(impl, 16, n, device="cpu", n2=2 if impl == "compiled" else None)))
            paths.append(path)
    texts = _run(tmp_path / "out", paths, device="cpu", grid={})
    joined = "\n".join(texts.values())
    assert "No cell ran out of memory on this CPU." in joined
    for word in ("CUDA memory", "card", "Nsight", "synchronize", "GPU"):
        assert word not in joined, word


def _flash(settings: dict) -> dict:
    return record("flash", 16, 1024, settings=settings)


def test_fused_rows_are_labelled_by_what_their_products_were():
    heading, text = report.products_note([_flash({"dot_precision": "tf32x3"})], "flash")
    assert heading == "fp32 inputs, 3xTF32 products" and "fp32-accurate, not IEEE" in text
    heading, _ = report.products_note([_flash({"dot_precision": "ieee"})], "flash")
    assert heading == "fp32 inputs, IEEE float32 products"
    heading, _ = report.products_note([_flash({}), _flash({"dot_precision": "tf32x3"})], "flash")
    assert heading == "fp32 inputs, 3xTF32 or IEEE products by record"
    assert report.products_note([record("plain", 16, 1024)], "plain") is None
    sdpa = record("sdpa", 16, 1024, settings={"sdpa_backends": ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"]})
    heading, text = report.products_note([sdpa], "sdpa")
    assert heading == "fp32 inputs, 3xTF32 products" and "EFFICIENT_ATTENTION" in text
