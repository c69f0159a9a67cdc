#!/usr/bin/env bash
# Install what tests/workflow/test_slurm.py needs on a Debian machine (as root): SLURM's daemons and
# client commands, munge, and Snakemake's SLURM executor plugin (the `cluster` extra).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
   || ! command -v munged >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
# the Python that runs Snakemake (tests/workflow/test_slurm.py passes its own); pyproject.toml's `cluster` extra
PYTHON=${PYTHON:-python3}
"$PYTHON" -c "import snakemake_executor_plugin_slurm" 2>/dev/null \
  || "$PYTHON" -m pip install -q "snakemake-executor-plugin-slurm>=2.8"
