#!/usr/bin/env bash
# Compare roofline's CPU ceilings with the best peers on this machine, interleaved in rounds
# (clocks and the host's memory traffic drift on virtual machines: each peer runs next to the
# probe it is compared with), best of the rounds for every figure:
#
#   cpu/fma/{f32,f64}/t1   vs likwid-bench peakflops{_sp}_avx512_fma (1 thread) and a plain C
#                          loop of 12 independent _mm512_fmadd chains (gcc -O3 -march=native)
#   cpu/mem/DRAM/triad/t1  vs likwid-bench triad_avx512_fma -w S0:1GB:1 and a C OpenMP STREAM
#                          triad over three 512 MiB arrays (also shown: likwid's stream_mem_avx512,
#                          the STREAM triad with non-temporal stores)
#   cpu/mem/{L1,L2}/triad/t1 vs likwid-bench triad_avx512_fma and stream_avx512_fma in L1 / L2
#   cpu/gemm/f32/t1 @4096  vs numpy's OpenBLAS sgemm, 1 thread, OPENBLAS_CORETYPE=SkylakeX
#   cpu/conv/f32 (largest 3x3 ResNet-50 layer) vs cpu/gemm/f32 of the same run
#
#   cpu/mem/{L1,L2}/read/t1 vs likwid-bench load_avx512 in L1 / L2
#
# ROOFLINE_ISA=avx2 compares the AVX2 path (roofline probe --isa avx2) with the peers' AVX2
# kernels instead: likwid's *_avx / *_avx_fma, the C triad built with -march=haswell (the C FMA
# peer is AVX-512 code and is left out). Like peers throughout: non-temporal with non-temporal
# (likwid stream_mem_*), write-allocate with write-allocate, equal stream counts named.
#
# Needs: likwid (apt-get install likwid), numpy (pip install numpy), gcc. Missing peers are
# reported and skipped. Usage: scripts/compare.sh [rounds=3]   (about 3 minutes a round)
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
OUT=compare-out
mkdir -p "$OUT"
cargo build --release --quiet || exit 1
BIN=target/release/roofline
ISA=${ROOFLINE_ISA:-avx512}
case "$ISA" in
    avx512) LK=avx512; MARCH=native ;;
    avx2) LK=avx; MARCH=haswell ;;
    *) echo "ROOFLINE_ISA=$ISA: this comparison knows avx512 and avx2"; exit 2 ;;
esac
probe() { ROOFLINE_ISA="$ISA" "$BIN" probe "$@"; }
# The stamp: what ran, when, at which revision, on what (tests/docs_stamped.rs asks it of docs/).
echo "# ROOFLINE_ISA=$ISA scripts/compare.sh $ROUNDS — $(date -u +%F), revision $(git describe --always --dirty --abbrev=7), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs"
echo "instruction set compared: $ISA (likwid *_$LK kernels, C peers -march=$MARCH)"

rm -f "$OUT/fma12"
[ "$ISA" = avx512 ] && { gcc -O3 -march=native -o "$OUT/fma12" scripts/fma12.c || echo "gcc failed: no C FMA peer"; }
gcc -O3 -march=$MARCH -fopenmp -o "$OUT/triad" scripts/triad.c || echo "gcc failed: no C triad peer"
have_likwid=0; command -v likwid-bench >/dev/null && have_likwid=1
have_numpy=0; python3 -c "import numpy" 2>/dev/null && have_numpy=1
[ $have_likwid = 1 ] || echo "likwid-bench not found (apt-get install likwid): skipping its figures"
[ $have_numpy = 1 ] || echo "numpy not found (pip install numpy): skipping the OpenBLAS figure"

RES="$OUT/results.txt"
: > "$RES"
rec() { echo "$1 $2" >> "$RES"; }

likwid() { # test workgroup -> MFlops/s or MByte/s number (in units of 1e6)
    likwid-bench -t "$1" -w "$2" 2>/dev/null | awk -v k="$3" '$1==k {print $2}'
}

sgemm() {
    OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1 env -u OPENBLAS_L2_SIZE python3 - <<'EOF'
import numpy as np, time
n = 4096
rng = np.random.default_rng(1)
a = rng.random((n, n), dtype=np.float32); b = rng.random((n, n), dtype=np.float32)
a @ b
best = 0.0
for _ in range(5):
    t = time.perf_counter(); c = a @ b; t = time.perf_counter() - t
    best = max(best, 2 * n**3 / t)
print(best)
EOF
}

# Peak arithmetic: the clock of this kind of virtual machine moves by +-10% within seconds, so
# the FMA comparison alternates probe and peers over twice as many (short) rounds.
for r in $(seq 1 $((2 * ROUNDS))); do
    echo "== FMA round $r/$((2 * ROUNDS))"
    probe --only fma -o "$OUT/fma.json" > /dev/null || exit 1
    python3 - "$OUT/fma.json" >> "$RES" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
for c in m["ceilings"]:
    if c["id"] in ("cpu/fma/f32/t1", "cpu/fma/f64/t1"):
        print(c["id"], c["value"])
EOF
    if [ -x "$OUT/fma12" ]; then
        "$OUT/fma12" 0.3 | while read -r k v; do rec "$k" "$(python3 -c "print($v*1e9)")"; done
    fi
    if [ $have_likwid = 1 ]; then
        rec likwid_peakflops_sp_fma "$(likwid peakflops_sp_${LK}_fma S0:32kB:1 MFlops/s:)e6"
        rec likwid_peakflops_fma "$(likwid peakflops_${LK}_fma S0:32kB:1 MFlops/s:)e6"
    fi
done

for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r/$ROUNDS"
    # Memory next to the memory probe (the quick sweep: same ids, coarser steps).
    probe --only mem --quick -o "$OUT/mem.json" > /dev/null || exit 1
    python3 - "$OUT/mem.json" >> "$RES" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
for c in m["ceilings"]:
    if c["id"] in ("cpu/mem/L1/triad/t1", "cpu/mem/L2/triad/t1", "cpu/mem/DRAM/triad/t1", "cpu/mem/DRAM/triad/all", "cpu/mem/L1/read/t1", "cpu/mem/L2/read/t1"):
        print(c["id"], c["value"])
EOF
    if [ $have_likwid = 1 ]; then
        rec likwid_triad_fma_1GB "$(likwid triad_${LK}_fma S0:1GB:1 MByte/s:)e6"
        rec likwid_stream_mem_1GB "$(likwid stream_mem_${LK} S0:1GB:1 MByte/s:)e6"
        rec likwid_triad_fma_L1 "$(likwid triad_${LK}_fma S0:16kB:1 MByte/s:)e6"
        rec likwid_stream_fma_L1 "$(likwid stream_${LK}_fma S0:16kB:1 MByte/s:)e6"
        rec likwid_triad_fma_L2 "$(likwid triad_${LK}_fma S0:256kB:1 MByte/s:)e6"
        rec likwid_stream_fma_L2 "$(likwid stream_${LK}_fma S0:256kB:1 MByte/s:)e6"
        rec likwid_load_L1 "$(likwid load_${LK} S0:16kB:1 MByte/s:)e6"
        rec likwid_load_L2 "$(likwid load_${LK} S0:256kB:1 MByte/s:)e6"
    fi
    if [ -x "$OUT/triad" ]; then
        OMP_NUM_THREADS=1 OMP_PROC_BIND=true "$OUT/triad" | while read -r k v; do rec "${k}_t1" "${v}e9"; done
    fi
    # GEMM and convolution: the default probe (n = 4096 is in its sweep).
    probe --only gemm,conv -o "$OUT/gemm.json" > /dev/null || exit 1
    python3 - "$OUT/gemm.json" >> "$RES" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
t = {t["id"]: t for t in m["tables"]}
for row in t["cpu/gemm/f32/t1/shapes"]["rows"]:
    if row["name"] == "square 4096":
        print("cpu/gemm/f32/t1@4096", row["value"])
for c in m["ceilings"]:
    if c["id"] in ("cpu/gemm/f32/t1", "cpu/gemm/f32/all", "cpu/conv/f32/all"):
        print(c["id"], c["value"])
# The ratio is per run: conv on the largest 3x3 layer over the GEMM ceiling of the same run.
gemm_all = next(c["value"] for c in m["ceilings"] if c["id"] == "cpu/gemm/f32/all")
for row in t["cpu/conv/f32/all/layers"]["rows"]:
    if "3x3" in row["name"]:
        print("ratio_conv_over_gemm:" + row["name"].replace(" ", "_"), row["value"] / gemm_all)
EOF
    if [ $have_numpy = 1 ]; then
        rec numpy_openblas_sgemm_t1_4096 "$(sgemm)"
    fi
done

python3 - "$RES" <<'EOF'
import sys, collections
best = collections.defaultdict(float)
for line in open(sys.argv[1]):
    k, v = line.split()
    try:
        best[k] = max(best[k], float(v))
    except ValueError:
        pass
def show(k, unit, scale):
    if k in best:
        print(f"  {k:<44} {best[k] / scale:10.1f} {unit}")
def ratio(ours, peers, need, label):
    have = [p for p in peers if p in best]
    if ours not in best or not have:
        print(f"  {label}: not measured (peer missing)")
        return
    peer = max(have, key=lambda p: best[p])
    r = best[ours] / best[peer]
    verdict = "ok" if need is None or r >= need else "BELOW"
    need_s = f" (need >= {need})" if need else ""
    print(f"  {label}: {best[ours]:.4g} / {best[peer]:.4g} [{peer}] = {r:.3f}{need_s} {verdict}")
print("best of rounds:")
for k in sorted(best):
    if k.startswith("ratio_"):
        continue
    unit, scale = ("GB/s", 1e9) if ("mem" in k or "triad" in k or "stream" in k) else ("GFLOP/s", 1e9)
    show(k, unit, scale)
print("\ncomparisons:")
ratio("cpu/fma/f32/t1", ["likwid_peakflops_sp_fma", "c_fma12_f32_gflops"], 0.95, "FMA f32 t1")
ratio("cpu/fma/f64/t1", ["likwid_peakflops_fma", "c_fma12_f64_gflops"], 0.95, "FMA f64 t1")
# DRAM: roofline's triad streams past the LLC with non-temporal stores; like peers are
# likwid's stream_mem (NT stores, 3 streams); the write-allocate ones are shown, not required.
ratio("cpu/mem/DRAM/triad/t1", ["likwid_stream_mem_1GB"], 0.95, "DRAM triad t1 vs likwid stream_mem (NT stores, 3 streams)")
ratio("cpu/mem/DRAM/triad/t1", ["likwid_triad_fma_1GB", "c_omp_triad_gbs_t1"], None, "DRAM triad t1 vs write-allocate peers (unlike: shown only)")
ratio("cpu/mem/L1/triad/t1", ["likwid_stream_fma_L1"], 0.85, "L1 triad t1 vs likwid stream (3 streams)")
ratio("cpu/mem/L1/triad/t1", ["likwid_triad_fma_L1"], None, "L1 triad t1 vs likwid triad (4 streams: unlike, shown only)")
ratio("cpu/mem/L2/triad/t1", ["likwid_stream_fma_L2"], 0.85, "L2 triad t1 vs likwid stream (3 streams)")
ratio("cpu/mem/L2/triad/t1", ["likwid_triad_fma_L2"], None, "L2 triad t1 vs likwid triad (4 streams: unlike, shown only)")
ratio("cpu/mem/L1/read/t1", ["likwid_load_L1"], 0.85, "L1 read t1 vs likwid load")
ratio("cpu/mem/L2/read/t1", ["likwid_load_L2"], 0.85, "L2 read t1 vs likwid load")
ratio("cpu/gemm/f32/t1@4096", ["numpy_openblas_sgemm_t1_4096"], 0.95, "sgemm t1 n=4096")
for k in sorted(best):
    if k.startswith("ratio_conv_over_gemm"):
        v = best[k]
        print(f"  conv/gemm {k.split(':', 1)[1]}: {v:.3f} (need >= 0.7) {'ok' if v >= 0.7 else 'BELOW'}")
EOF
