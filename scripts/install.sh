#!/usr/bin/env bash
# Install lmperf (editable) into the active Python environment:
#   scripts/install.sh                    the pipeline
#   scripts/install.sh test,cluster       also the tests and the SLURM executor (extras of pyproject.toml)
# Without an NVIDIA GPU it installs PyTorch's CPU build and the versions CI tests
# (constraints/ci-cpu.txt): pip's default torch is a multi-GB CUDA build that a CPU cannot use.
# With one (nvidia-smi lists a GPU) it installs pip's default, CUDA, build, unpinned.
# LMPERF_TORCH_INDEX: an extra index the CPU build may come from (default: PyTorch's CPU index);
# set it empty to use pip's configured sources only (a local wheel directory, a mirror).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:+[$1]}
if nvidia-smi -L >/dev/null 2>&1; then
    echo "install.sh: NVIDIA GPU found: PyTorch's default (CUDA) build" >&2
    exec pip install -e ".$extras"
fi
echo "install.sh: no NVIDIA GPU: PyTorch's CPU build, versions pinned by constraints/ci-cpu.txt" >&2
index=${LMPERF_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
# an extra index, so pip's own sources stay (a local wheel directory, a mirror, PyPI for torch's
# dependencies); an index that cannot be reached is skipped without retries
pip install --retries 0 -c constraints/ci-cpu.txt ${index:+--extra-index-url "$index"} torch
pip install -c constraints/ci-cpu.txt -e ".$extras"
