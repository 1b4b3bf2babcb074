#!/usr/bin/env bash
# How often `roofline gate` cries wolf, and how often it catches a real slowdown, on this
# machine, with the gate's default settings and one run per side (the quick start's use):
#   - PAIRS+1 quick probes with nothing changed (q0 … qN) and PAIRS with every CPU ceiling
#     slowed by ROOFLINE_TEST_SLOWDOWN (s1 … sN), interleaved q0 s1 q1 s2 q2 … so that a drift
#     of the host touches both kinds alike;
#   - the gate over every quiet pair (q(i-1) → qi): each exit 1 is a false alarm;
#   - the gate over every slowed pair (q(i-1) → si): each exit 0 is a missed regression.
# A probe the gate refuses (exit 2: measured on a busy machine) is counted apart.
# Usage: scripts/gate-study.sh [--pairs N] [--slowdown F] [--out DIR] [--bin PATH] [-- PROBE ARGS]
# (default: 20 pairs, 0.15, target/gate-study, target/release/roofline, `--quick`).
# About 25 minutes for 20 pairs on a 2-core VM; the summary is DIR/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=20
slowdown=0.15
out=target/gate-study
bin=target/release/roofline
probe_args=(--quick)
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) pairs=$2; shift 2 ;;
        --slowdown) slowdown=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --) shift; probe_args=("$@"); break ;;
        *) echo "usage: scripts/gate-study.sh [--pairs N] [--slowdown F] [--out DIR] [--bin PATH] [-- PROBE ARGS]" >&2; exit 2 ;;
    esac
done
[ -x "$bin" ] || { echo "no $bin: build it first (cargo build --release)" >&2; exit 2; }
mkdir -p "$out"
probe() { # probe NAME [ENV...]
    local name=$1; shift
    if [ -s "$out/$name.json" ]; then return; fi # a resumed study keeps what it has
    env "$@" "$bin" probe "${probe_args[@]}" -o "$out/$name.json" >"$out/$name.log" 2>&1 \
        || { echo "probe $name failed: see $out/$name.log" >&2; exit 1; }
    echo "$(date +%T) $name"
}
probe q0
for i in $(seq 1 "$pairs"); do
    probe "s$i" ROOFLINE_TEST_SLOWDOWN="$slowdown"
    probe "q$i"
done
alarms=0 quiet=0 detected=0 missed=0 refused=0
: >"$out/summary.txt"
for i in $(seq 1 "$pairs"); do
    for kind in q s; do
        set +e
        "$bin" gate --baseline "$out/q$((i - 1)).json" --current "$out/$kind$i.json" \
            >"$out/gate-$kind$i.txt" 2>&1
        rc=$?
        set -e
        case "$kind$rc" in
            q1) alarms=$((alarms + 1)); echo "false alarm q$((i - 1)) → q$i: $(grep -c REGRESSED "$out/gate-$kind$i.txt") ids" >>"$out/summary.txt" ;;
            s0) missed=$((missed + 1)); echo "missed q$((i - 1)) → s$i" >>"$out/summary.txt" ;;
            q0) quiet=$((quiet + 1)) ;;
            s1) detected=$((detected + 1)) ;;
            *) refused=$((refused + 1)); echo "refused ($rc) q$((i - 1)) → $kind$i: $(tail -1 "$out/gate-$kind$i.txt")" >>"$out/summary.txt" ;;
        esac
    done
done
{
    echo "gate study: $pairs quiet and $pairs slowed pairs (ROOFLINE_TEST_SLOWDOWN=$slowdown), probe ${probe_args[*]}, $(date -u +%F)"
    echo "false alarms: $alarms of $((alarms + quiet)) quiet pairs compared"
    echo "detected:     $detected of $((detected + missed)) slowed pairs compared"
    echo "refused:      $refused"
} | tee -a "$out/summary.txt"
