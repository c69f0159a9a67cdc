set -x
python -c "import torch, torch._functorch.config as c; print(torch.__version__, 'force_non_lazy', hasattr(c,'force_non_lazy_backward_lowering'))"
nproc
mkdir -p $OUT/cc
T=$(date +%s)
timeout 300 python -m lmperf.cells e2e_compile --output "$OUT/cc/{model}_ctx{ctx}_{precision}.json" --cache '.cache/tc/{model}_ctx{ctx}_{precision}' --device h100 --cells small:128:fp32 large:512:fp32 2.7B:512:fp32 xl:1024:fp32 --batch-size 4 --vocab-size 10000
echo "compile job $(( $(date +%s) - T )) s"
du -sh .cache/tc/*
for c in small:128 2.7B:512; do m=${c%:*}; n=${c#*:}; T=$(date +%s); timeout 150 python -m lmperf.cells e2e --output $OUT/cc/measured_${m}_${n}.json --device h100 --model $m --context-length $n --compile compiled --compile-cache .cache/tc/${m}_ctx${n}_fp32 --warmup-steps 5 --measured-steps 10 --batch-size 4 --vocab-size 10000 2>&1 | tail -2; echo "measured $c $(( $(date +%s) - T )) s"; done
timeout 200 python -m pytest -q -x tests/test_flash_triton.py tests/test_flash_compile.py tests/test_flash_warm.py tests/test_flash_tuning.py 2>&1 | tail -4
