#!/usr/bin/env bash
# How often `roofline gate` cries wolf, and how often it catches a real slowdown, on this
# machine, with the gate's default settings and one current run, against the README's CI
# recipe's baseline (K quick probes, `probe --quick --runs K`) and against one run:
#   - K+PAIRS quick probes with nothing changed (q1 … q(K+PAIRS)) and PAIRS with every CPU
#     ceiling slowed by ROOFLINE_TEST_SLOWDOWN (s(K+1) … s(K+PAIRS)), interleaved
#     … s(i) q(i) … so that a drift of the host touches both kinds alike;
#   - calibrated: for every i, the K quiet runs before it (q(i-K) … q(i-1), pooled as gate pools
#     a `--runs K` baseline) against q(i) (an exit 1 is a false alarm) and against s(i) (an exit
#     0 is a missed regression): each pair has its own baseline, so the rates are not one
#     baseline's luck;
#   - single: q(i-1) against q(i) and s(i), the one-run baseline the priors are for.
# A probe the gate refuses (exit 2: measured on a busy machine) is counted apart.
# Usage: scripts/gate-study.sh [--pairs N] [--calibrate K] [--slowdown F] [--out DIR] [--bin PATH]
#        [-- PROBE ARGS]
# (default: 20 pairs, K = 5, 0.15, target/gate-study, target/release/roofline, `--quick`).
# About 15 minutes for 20 pairs on a 2-core VM (a quick probe takes about 20 s); the summary
# is DIR/summary.txt, every gate's report DIR/gate-*.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=20
k=5
slowdown=0.15
out=target/gate-study
bin=target/release/roofline
probe_args=(--quick)
usage="usage: scripts/gate-study.sh [--pairs N] [--calibrate K] [--slowdown F] [--out DIR] [--bin PATH] [-- PROBE ARGS]"
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) pairs=$2; shift 2 ;;
        --calibrate) k=$2; shift 2 ;;
        --slowdown) slowdown=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --) shift; probe_args=("$@"); break ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
[ "$k" -ge 1 ] 2>/dev/null || { echo "$usage (K ≥ 1)" >&2; exit 2; }
[ -x "$bin" ] || { echo "no $bin: build it first (cargo build --release)" >&2; exit 2; }
mkdir -p "$out"
probe() { # probe NAME [ENV...]
    local name=$1; shift
    if [ -s "$out/$name.json" ]; then return; fi # a resumed study keeps what it has
    env "$@" "$bin" probe "${probe_args[@]}" -o "$out/$name.json" >"$out/$name.log" 2>&1 \
        || { echo "probe $name failed: see $out/$name.log" >&2; exit 1; }
    echo "$(date +%T) $name"
}
for i in $(seq 1 "$k"); do probe "q$i"; done
last=$((k + pairs))
for i in $(seq $((k + 1)) "$last"); do
    probe "s$i" ROOFLINE_TEST_SLOWDOWN="$slowdown"
    probe "q$i"
done
: >"$out/summary.txt"
# study MODE: gates every pair with MODE's baseline; prints "alarms quiet detected missed refused".
study() {
    local mode=$1 alarms=0 quiet=0 detected=0 missed=0 refused=0 i kind rc base
    for i in $(seq $((k + 1)) "$last"); do
        if [ "$mode" = calibrated ]; then
            base=$(for j in $(seq $((i - k)) $((i - 1))); do printf '%s ' "$out/q$j.json"; done)
        else
            base="$out/q$((i - 1)).json"
        fi
        for kind in q s; do
            set +e
            # shellcheck disable=SC2086
            "$bin" gate --baseline $base --current "$out/$kind$i.json" >"$out/gate-$mode-$kind$i.txt" 2>&1
            rc=$?
            set -e
            case "$kind$rc" in
                q1) alarms=$((alarms + 1)); echo "$mode: false alarm → q$i: $(grep -c REGRESSED "$out/gate-$mode-$kind$i.txt") ids" >>"$out/summary.txt" ;;
                s0) missed=$((missed + 1)); echo "$mode: missed → s$i" >>"$out/summary.txt" ;;
                q0) quiet=$((quiet + 1)) ;;
                s1) detected=$((detected + 1)) ;;
                *) refused=$((refused + 1)); echo "$mode: refused ($rc) → $kind$i: $(tail -1 "$out/gate-$mode-$kind$i.txt")" >>"$out/summary.txt" ;;
            esac
        done
    done
    echo "$alarms $quiet $detected $missed $refused"
}
{
    echo "gate study: $pairs quiet and $pairs slowed pairs (ROOFLINE_TEST_SLOWDOWN=$slowdown), probe ${probe_args[*]}, $(date -u +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)"
    for mode in calibrated single; do
        read -r alarms quiet detected missed refused < <(study "$mode")
        if [ "$mode" = calibrated ]; then what="a baseline of the $k runs before"; else what="a baseline of the run before"; fi
        echo "$mode ($what): false alarms $alarms of $((alarms + quiet)) quiet pairs; detected $detected of $((detected + missed)) slowed pairs; refused $refused"
    done
} | tee -a "$out/summary.txt"
