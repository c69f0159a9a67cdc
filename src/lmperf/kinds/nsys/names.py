"""Short names for long kernel names, and the legend that gives them in full.

cuBLAS and CUTLASS name their GEMMs with whole templates (``sm80_xmma_gemm_f32f32_…_tilesize128x128x8_…``);
tables show a short name (``xmma gemm f32f32 tn 128x128x8``) and a legend under them the full one.
Two names that shorten alike are both listed, never merged silently. No torch here.
"""

from __future__ import annotations

import re
from collections import defaultdict

# Kernel names longer than this are cut in tables; the legend gives them in full.
SHORT_NAME_CHARS = 48

# cuBLAS's Hopper GEMMs: nvjet_sm90_tst_<tile MxN>_<K>x<stages>_<cluster>_<h|v>_bz[_coopA|_coopB]_<layouts>
_NVJET = re.compile(r"nvjet_sm\d+_\w+?_(\d+x\d+)_(\d+)x\d+_(\d+x\d+)_[hv]_\w+?_([NT]{3})\b")
_XMMA = re.compile(r"xmma_gemm_(\w+?)_(tn|nt|nn|tt)_n_tilesize(\d+x\d+x\d+)")
_CUTLASS = re.compile(r"cutlass_\d+_(\w+?gemm)_(\d+x\d+)_\w*?_(nn|nt|tn|tt)")


def compact_kernel_name(label):
    """'xmma gemm f32f32 tn 128x128x8' (and '… split-k') for cuBLAS's Ampere-style templates,
    'nvjet 256x128x64 1x2 NTT' (tile M×N×K, cluster, layouts) for its Hopper nvjet kernels,
    'cutlass simt_sgemm 128x128 nt'; other names longer than SHORT_NAME_CHARS are cut with '…'."""
    if not isinstance(label, str):
        return label
    m = _XMMA.search(label)
    if m:
        split_k = " split-k" if "split_k" in label else ""
        return f"xmma gemm {m.group(1).split('_')[0]} {m.group(2)} {m.group(3)}{split_k}"
    m = _NVJET.search(label)
    if m:
        return f"nvjet {m.group(1)}x{m.group(2)} {m.group(3)} {m.group(4)}"
    m = _CUTLASS.search(label)
    if m:
        return f"cutlass {m.group(1)} {m.group(2)} {m.group(3)}"
    return label if len(label) <= SHORT_NAME_CHARS else label[: SHORT_NAME_CHARS - 1] + "…"


def short(label) -> str:
    """A kernel's short name in backticks, '—' for none."""
    return f"`{compact_kernel_name(label)}`" if isinstance(label, str) else "—"


def kernel_legend(labels) -> str:
    """The full name of every name a table shows shortened, as a markdown list ('' when none is);
    where two names shorten alike both are listed and the legend says the table does not tell them apart."""
    full_names: dict[str, set[str]] = defaultdict(set)
    for x in labels:
        if isinstance(x, str) and compact_kernel_name(x) != x:
            full_names[compact_kernel_name(x)].add(x)
    lines = [
        f"- `{name}`: "
        + " or ".join(f"`{full}`" for full in sorted(fulls))
        + (" (one short name for these; the table does not tell them apart)" if len(fulls) > 1 else "")
        for name, fulls in sorted(full_names.items())
    ]
    return "\n".join(lines)
