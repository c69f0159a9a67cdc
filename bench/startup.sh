#!/usr/bin/env bash
# Per-cell start-up with and without the fork server: N e2e cells each way, one summary JSON.
#   bash bench/startup.sh OUTDIR DEVICE [N] [MODEL] [CTX]
# Start-up = client process start -> first step (warm-up excluded) and -> first measured step,
# as the cells record them (process_start_to_first_step_s, process_start_to_first_measured_step_s).
set -euo pipefail
out=$1 device=$2 n=${3:-6} model=${4:-small} ctx=${5:-128}
mkdir -p "$out/cells"
export LMPERF_FORKSERVER_DIR="$out/servers"
for mode in 0 1; do
  for i in $(seq 1 "$n"); do
    t0=$(date +%s.%N)
    LMPERF_FORKSERVER=$mode python -m lmperf.cells e2e --output "$out/cells/fs${mode}_$i.json" --device "$device" \
      --model "$model" --context-length "$ctx" --warmup-steps 5 --measured-steps 10 2>>"$out/cells.log"
    t1=$(date +%s.%N)
    echo "$mode $i $t0 $t1" >>"$out/walls.txt"
  done
done
python - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
walls = {(m, int(i)): float(b) - float(a) for m, i, a, b in (l.split() for l in (out / "walls.txt").read_text().splitlines())}
summary = {}
for mode, name in (("0", "in_process"), ("1", "forkserver")):
    rows = []
    for (m, i), wall in sorted(walls.items()):
        if m == mode:
            r = json.loads((out / "cells" / f"fs{m}_{i}.json").read_text())
            rows.append({"i": i, "wall_s": round(wall, 3), "status": r["status"],
                         "to_first_step_s": r["metrics"].get("process_start_to_first_step_s"),
                         "to_first_measured_step_s": r["metrics"].get("process_start_to_first_measured_step_s"),
                         "training_step_ms_mean": r["metrics"].get("training_step_ms_mean")})
    med = lambda k, rs: statistics.median(x[k] for x in rs if x[k] is not None)
    summary[name] = {"cells": rows, **{f"median_{k}": med(k, rows) for k in ("wall_s", "to_first_step_s", "to_first_measured_step_s")},
                     **{f"median_{k}_after_first": med(k, rows[1:]) for k in ("wall_s", "to_first_step_s", "to_first_measured_step_s")}}
(out / "startup_summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "cells"} for k, v in summary.items()}, indent=1))
PY
