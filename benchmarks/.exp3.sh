set -u
mkdir -p $OUT
( nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMOK_SM90_TIMING -Icsrc/cuda -o /tmp/t42 benchmarks/sm90_gemm_timing.cu -lcuda ) > $OUT/nvcc.log 2>&1 &
source benchmarks/gpu_session.sh >/dev/null 2>&1; tail -1 $OUT/build.log
wait
python3 -m pytest tests -q -m gpu -x > $OUT/gpu_tests.log 2>&1; tail -1 $OUT/gpu_tests.log
for shape in "131072 128 2048 768" "131072 128 1536 2048 swiglu" "65536 32 7168 2048"; do
 echo "== $shape"; /tmp/t42 $shape | grep -v "cycles per\|SM clock\|drain"
done 2>&1 > $OUT/timing.txt
python3 benchmarks/trace_moe_layer.py --shapes qwen3_30b_a3b,mixtral_8x7b,dsv3_ep8_slice --impls mok,eager --top 12 > $OUT/trace.txt 2>&1
cat $OUT/timing.txt; grep -A14 "^==" $OUT/trace.txt | cut -c1-90
