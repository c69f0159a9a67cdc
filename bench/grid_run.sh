#!/bin/bash
# One device call of a GPU grid re-measure: `snakemake --cores 1 TARGETS` on a copy of the working
# tree that is checked to hold exactly the code of one commit, stopped cleanly before the call's limit.
#
# usage (on the GPU machine, from the checkout root):
#   bash bench/grid_run.sh DEVICE DRAIN_S LIMIT_S [TARGET ...]
#
# - The copy's code must match the manifest in $LMPERF_MANIFEST (default .gpu/manifest), written here
#   beforehand with `python scripts/code_manifest.py write .gpu/manifest [COMMIT]`; the records then
#   say that commit and `git_dirty: false` (LMPERF_GIT_COMMIT, LMPERF_GIT_DIRTY).
# - After DRAIN_S seconds no new cell process starts: a `python` shim first on PATH refuses
#   `python -m lmperf.cells ...` (exit 75, the job fails, Snakemake stops scheduling), and the running
#   cell finishes. LIMIT_S is the hard stop (`timeout`), which kills a running cell and loses its work:
#   leave LIMIT_S - DRAIN_S above the longest job the call may start (attention and flash jobs take
#   1-2.5 minutes, the compile job 5-9, a ladder job under 1). A call with less than
#   $GRID_RUN_MIN_TAIL_S (default 150) between them is refused before anything runs: at the end of
#   a machine's time, set it lower knowingly (a call drained at 70 s with a 130 s limit lost the
#   attention job it had started).
# - `python bench/grid_targets.py DEVICE .gpu` writes a device's records of `all` as three target lists
#   (the compile job with the compiled cells, the rest, the ladder). Snakemake does not run targets in
#   the order named: to have the compiled cells measured on the machine that compiled their graphs
#   when `t1` and `t2` share a call, add `--prioritize $(cat .gpu/DEVICE_t1)` after the targets (the
#   arguments after LIMIT_S go to Snakemake as they are).
# - Name record paths as TARGETS (not `all`): the aggregates are rebuilt afterwards on any machine with
#   `snakemake --cores 1 all --config device=DEVICE report_only=true`. `--until` is avoided: with it,
#   Snakemake 9 left a job depending on the named rules unrun (bench/grid_time_notes.md).
# - What the call made (results/, report/, logs/, bench/results/; not the git-ignored raw nsys and
#   memory artifacts) comes back in $OUT as 15 MiB parts of one tar, with Snakemake's log. Unpack them
#   in the checkout before the next call (`cat DIR/new.tgz.part-* | tar xzf -`): a kept machine's copy
#   is re-synced to the checkout, and records not unpacked would be measured again.
# - The GPU machine's environment comes from $LMPERF_ACTIVATE (default .gpu/activate.sh, made by
#   ../shared/gpu/prepare-carry.sh) when that file exists.
#
# What a whole device grid took this way: bench/grid_time_notes.md.
set -u
if [ $# -lt 3 ]; then
  echo "usage: bash bench/grid_run.sh DEVICE DRAIN_S LIMIT_S [TARGET ...]" >&2
  exit 2
fi
device=$1 drain=$2 limit=$3
shift 3
min_tail=${GRID_RUN_MIN_TAIL_S:-150}
if ! [[ $drain =~ ^[0-9]+$ && $limit =~ ^[0-9]+$ && $min_tail =~ ^[0-9]+$ ]]; then
  echo "DRAIN_S, LIMIT_S and GRID_RUN_MIN_TAIL_S must be whole seconds: got '$drain', '$limit', '$min_tail'" >&2
  exit 2
fi
if [ $((limit - drain)) -lt "$min_tail" ]; then
  echo "LIMIT_S - DRAIN_S is $((limit - drain)) s, under $min_tail s: a job started just before the drain" \
    "would be killed at the limit and its work lost (set GRID_RUN_MIN_TAIL_S to allow it)" >&2
  exit 2
fi
out=${OUT:?OUT must name the folder that comes back}
activate=${LMPERF_ACTIVATE:-.gpu/activate.sh}
manifest=${LMPERF_MANIFEST:-.gpu/manifest}
if [ -f "$activate" ]; then
  # shellcheck disable=SC1090
  source "$activate" || exit 1
fi
python3 scripts/code_manifest.py check "$manifest" || {
  echo "the code here is not the manifest's commit: nothing measured" >&2
  exit 3
}
LMPERF_GIT_COMMIT=$(cat "$manifest/commit")
export LMPERF_GIT_COMMIT LMPERF_GIT_DIRTY=0
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader 2>/dev/null || true
rm -rf logs/stale
marker=$(mktemp)
sleep 1

real_python=$(command -v python) || {
  echo "no python on PATH" >&2
  exit 1
}
shim=$(mktemp -d)
deadline=$(($(date +%s) + drain))
cat >"$shim/python" <<SHIM
#!/bin/bash
if [ "\${1:-}" = "-m" ] && [ "\${2:-}" = "lmperf.cells" ] && [ \$(date +%s) -ge $deadline ]; then
  echo "drain: not starting \$*" >&2
  exit 75
fi
exec "$real_python" "\$@"
SHIM
chmod +x "$shim/python"

start=$(date +%s)
PATH="$shim:$PATH" timeout "$limit" snakemake --cores 1 "$@" --config device="$device" >"$out/snakemake.log" 2>&1
rc=$?
echo "snakemake exit status $rc after $(($(date +%s) - start)) s (a drained job makes it 1)"
tail -n 25 "$out/snakemake.log"

find results report logs bench/results -newer "$marker" -type f \
  ! -name '*.nsys-rep' ! -name '*.sqlite' ! -name '*.pickle' ! -name '*.pkl' ! -name '*.qdstrm' >"$marker.files"
records=$(grep -c "^results/$device/[a-z0-9_]*/[^/]*\.json$" "$marker.files")
echo "$(wc -l <"$marker.files") new files, $records of them records"
tar czf "$marker.tgz" -T "$marker.files" && split -b 15M "$marker.tgz" "$out/new.tgz.part-"
ls -la "$out"
