# cold then warm compile of one e2e cell (2.7B, 512), then large at 4 lengths compiled concurrently
# into one cache and re-run one after another (warm)
set -u
X=$(mktemp -d); TX=$(mktemp -d)
for run in cold warm; do
  s=$(date +%s.%N)
  TORCHINDUCTOR_CACHE_DIR=$X TRITON_CACHE_DIR=$TX python bench/compile_ab.py --mode whole --model 2.7B --context-lengths 512 2>/dev/null | sed "s/^/$run /"
  echo "$run process_s $(awk "BEGIN{print $(date +%s.%N) - $s}")"
done
Y=$(mktemp -d); TY=$(mktemp -d)
s=$(date +%s.%N)
for L in 128 256 512 1024; do
  TORCHINDUCTOR_CACHE_DIR=$Y TRITON_CACHE_DIR=$TY python bench/compile_ab.py --mode whole --model large --context-lengths $L > /tmp/par_$L.jsonl 2>/tmp/par_$L.err &
done
wait
echo "parallel4 wall_s $(awk "BEGIN{print $(date +%s.%N) - $s}")"
for L in 128 256 512 1024; do sed "s/^/par /" /tmp/par_$L.jsonl; tail -2 /tmp/par_$L.err; done
for L in 128 256 512 1024; do
  s=$(date +%s.%N)
  TORCHINDUCTOR_CACHE_DIR=$Y TRITON_CACHE_DIR=$TY python bench/compile_ab.py --mode whole --model large --context-lengths $L 2>/dev/null | sed "s/^/warm /"
  echo "warm large $L process_s $(awk "BEGIN{print $(date +%s.%N) - $s}")"
done
