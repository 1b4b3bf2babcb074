#!/usr/bin/env bash
# roofline's MPI allreduce busbw against a plain C loop calling MPI_Allreduce
# (scripts/mpi_allreduce.c), same sizes, same timing rule (barrier; per-iteration time = max
# over ranks; best iteration), in alternating rounds. Needs a build with --features mpi.
#   scripts/compare-mpi.sh [ranks] [rounds]      (QUICK=1: roofline with --quick)
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${1:-2}
ROUNDS=${2:-3}
SIZES="16777216 33554432 67108864"
RUN="mpirun --allow-run-as-root --oversubscribe -np $NP"
cargo build --release --features mpi -q
mpicc -O2 -o target/mpi_allreduce scripts/mpi_allreduce.c
out=$(mktemp -d)
for r in $(seq "$ROUNDS"); do
    $RUN target/release/roofline probe --only comm ${QUICK:+--quick} --max-size 64M -o "$out/m$r.json" >/dev/null
    $RUN target/mpi_allreduce $SIZES > "$out/c$r.txt"
done
python3 - "$out" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
best_r, best_c = {}, {}
for r in range(1, rounds + 1):
    m = json.load(open(f"{out}/m{r}.json"))
    curve = next(c for c in m["curves"] if c["id"] == "net/allreduce/intra")
    for p in curve["points"]:
        best_r[int(p["x"])] = max(best_r.get(int(p["x"]), 0), p["value"])
    for line in open(f"{out}/c{r}.txt"):
        size, best, _median = line.split()
        best_c[int(size)] = max(best_c.get(int(size), 0), float(best))
print(f"{'size':>10} {'roofline busbw':>16} {'C MPI_Allreduce':>16} {'ratio':>6}")
for size in sorted(best_c):
    a, b = best_r.get(size, 0), best_c[size]
    print(f"{size >> 20:>7} MiB {a/1e9:>12.2f} GB/s {b/1e9:>12.2f} GB/s {a/b:>6.3f}")
PY
rm -rf "$out"
