#!/usr/bin/env bash
# Does the fork server's Inductor preload (lmperf.cells.forkserver.PRELOAD_CUDA_ANSWERED) shorten a
# compiled cell's start, and do its children still load the compile job's graphs and use CUDA?
#
# One compile job (MODEL at context CTX, fp32; small at 128 unless told) fills a scratch cache; then the same warm compiled
# e2e cell runs ROUNDS times through a server with the preload and through one without it (a copy of
# src/ with PRELOAD_CUDA_ANSWERED emptied: another PYTHONPATH, so another server), alternating, the
# workflow's one compile worker each. Prints one line per run (start-up, first step, graph loading,
# cache misses, the training step) and the servers' logs. Records go to a scratch directory, never to
# results/. Needs a GPU; run from the repository root:
#
#     [DEVICE=h100] [MODEL=small] [CTX=128] bash bench/inductor_preload_check.sh [SCRATCH] [ROUNDS]
set -euo pipefail
scratch=${1:-/tmp/inductor_preload_check}
rounds=${2:-2}
device=${DEVICE:-h100}
model=${MODEL:-small}
ctx=${CTX:-128}
rm -rf "$scratch" && mkdir -p "$scratch"
# the copy without the preload sits where src/ does in the checkout (its schemas are found from there)
mkdir -p "$scratch/without" && cp -r src "$scratch/without/src" && ln -s "$(pwd)/workflow" "$scratch/without/workflow"
sed -i 's/^PRELOAD_CUDA_ANSWERED = .*/PRELOAD_CUDA_ANSWERED = ()/' "$scratch/without/src/lmperf/cells/forkserver.py"
grep -q '^PRELOAD_CUDA_ANSWERED = ()' "$scratch/without/src/lmperf/cells/forkserver.py"
export LMPERF_FORKSERVER_DIR="$scratch/servers" LMPERF_FORKSERVER=1
with_src=$(pwd)/src
cell=(--device "$device" --model "$model" --context-length "$ctx" --precision fp32 --compile compiled --warmup-steps 5
    --attention plain --compile-cache "$scratch/cache/${model}_ctx${ctx}_fp32" --compile-threads 1 --batch-size 4 --vocab-size 10000)

PYTHONPATH=$with_src${PYTHONPATH:+:$PYTHONPATH} python -m lmperf.cells e2e_compile --device "$device" --cells "$model:$ctx:fp32" --batch-size 4 \
    --vocab-size 10000 --output "$scratch/compile/{model}_ctx{ctx}_{precision}.json" \
    --cache "$scratch/cache/{model}_ctx{ctx}_{precision}" --log "$scratch/compile/{model}_ctx{ctx}_{precision}.log" \
    > "$scratch/compile_job.log" 2>&1
for round in $(seq "$rounds"); do
    for variant in with without; do
        src=$with_src
        [ "$variant" = without ] && src=$scratch/without/src
        PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH} python -m lmperf.cells e2e "${cell[@]}" --output "$scratch/runs/${variant}_$round.json" \
            > "$scratch/runs_${variant}_$round.log" 2>&1
    done
done
python - "$scratch" <<'EOF'
import json, pathlib, sys
scratch = pathlib.Path(sys.argv[1])
keys = ("process_start_to_first_step_s", "training_first_step_ms", "compile_s", "inductor_fxgraph_cache_misses",
        "training_step_ms_mean")
for path in sorted((scratch / "runs").glob("*.json")):
    r = json.loads(path.read_text())
    m = r["metrics"]
    print(path.stem, r["status"], {k: round(m[k], 3) if isinstance(m.get(k), float) else m.get(k) for k in keys},
          "process_age_s", r["provenance"]["process_age_s"])
EOF
tail -n 3 "$scratch"/servers/*.log
