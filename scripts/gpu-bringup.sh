#!/usr/bin/env bash
# Bring roofline's GPU path up on a GPU machine lent for one short lease: two calls of at most
# 8 minutes each, the most trustworthy figures first, nothing lost when a call ends early.
#
#   scripts/gpu-bringup.sh pack                 # here (any x86-64 Linux with Rust): build the kit
#   scripts/gpu-bringup.sh plan [1|2]           # each call's steps, limits, estimates, sources
#   scripts/gpu-bringup.sh run OUT [1|2|all] [--dry-run]   # on the GPU machine, from the kit
#
# pack builds a release binary (no MPI: it must start on a machine without an MPI library),
# strips it, and puts it with this script, the Python helpers, the summary's schema and the
# measured step times into target/bringup/ (about 8 MB; ROOFLINE_KIT_DIR sets another folder,
# ROOFLINE_KIT_BINARY packs a binary already built). On the GPU machine it needs no Rust and
# no network: the NVIDIA driver, the CUDA libraries (a toolkit, or the pip wheels of CUDA 12 or
# 13, e.g. those PyTorch installs), and PyTorch for the peers.
#
# Call 1 carries every correctness check and the headline figures (doctor, kernels, probe
# --check, a quick probe of the tensor peaks, GEMM and HBM, train --check in f32 and bf16,
# ResNet-50 at batch 128 in bf16, f16, tf32 and f32 against PyTorch at the same batch and
# precisions); call 2 the rest (the convolutions' quick probe and PyTorch at those shapes, burst
# against sustained, batch 256, the detector's check and trainings against torchvision, a short
# AutoML search on the GPU). `plan` prints them. Each step runs under the smaller of its own
# limit and what is left of the call's budget (ROOFLINE_BRINGUP_BUDGET, 480 s) less a reserve
# for the summary (ROOFLINE_BRINGUP_RESERVE, 45 s); a step that cannot start in time is
# recorded as skipped, a failed one as failed, and the next one runs. The exit code is the
# number of steps that failed or were skipped for want of time (0: all ran and passed).
#
# At most four files are written into OUT, each rewritten as every step starts and ends (a
# call killed at any point returns what finished): summary.json (the record to commit as
# docs/gpu/<date>-<gpu>.json; its schema is summary.schema.json), summary.txt (the same for
# people), log-tail.txt (the last 64 KiB of the log) and bundle.tar.gz (everything else: the
# whole log, machine files, train reports, peers.json, placements, automl files, the cuDNN
# algorithm cache; under 16 MiB). Call 2 takes call 1's machine file and algorithm cache from
# ROOFLINE_BRINGUP_FROM (call 1's bundle.tar.gz, or a folder holding it).
#
# Estimates: each step's own measured time from step-times.tsv (name, seconds, where measured;
# ROOFLINE_BRINGUP_TIMES sets another file) replaces the estimate this script gives, whose
# source `plan` names. summary.json records every step's seconds: add them to step-times.tsv.
#
# --dry-run runs the same steps on this CPU (CI does): --device cpu and small sizes where a step
# has a CPU form, PyTorch's side from fixture files (ROOFLINE_BRINGUP_FIXTURES, default
# tests/fixtures/bringup beside the kit or the repository), the GPU-only steps recorded as
# skipped. Its clock (ROOFLINE_BRINGUP_CLOCK: estimate by default in a dry run, else real)
# charges each step its estimate, so the budget is kept as the GPU would keep it.
# ROOFLINE_BRINGUP_FAIL (a comma list of step names) makes those steps fail, and
# ROOFLINE_BRINGUP_HANG makes them hang (until the call is killed), to test the kit.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
BUDGET=${ROOFLINE_BRINGUP_BUDGET:-480}
RESERVE=${ROOFLINE_BRINGUP_RESERVE:-45}

# The steps of call $1, as `S NAME LIMIT ESTIMATE SOURCE FUNCTION ARGS...` lines: the step's
# name, its own limit (s), the estimate of its time on an H100/H200 (s) and where that estimate
# comes from, then what runs it. `plan` prints them; `run` runs them.
H200_5="the 2026-11-28 H200 run (docs/gpu/gpu-bringup-2026-11-28-h200-5.md)"
steps_of() {
    case $1 in
        1)
            S doctor 30 5 "$H200_5: about 2 s" do_doctor
            S kernels 60 20 "estimate: NVRTC for every kernel at sm_80, 89, 90 on 16 cores (CI: about 40 s on 2)" do_kernels
            S probe-check 120 45 "estimate: every GPU kernel once, 4 conv shapes x 3 directions x 4 precisions searched at batch 2 (at most 1 s each)" do_probe_check
            S probe-quick 120 60 "estimate: $H200_5's quick probe without its convolutions (fma, mma, wgmma, mem, gemm, copy)" do_probe_quick
            S train-check-f32 120 50 "estimate: $H200_5's train --check (46 comparisons) plus the described networks" do_train_check f32
            S train-check-bf16 90 40 "estimate: as train-check-f32, the 16-bit references" do_train_check bf16
            local p
            for p in bf16 f16 tf32 f32; do
                S "resnet50-$p-b128" 75 30 "estimate: model set-up, cuDNN searches within the trainer's 20 s budget (fewer from the cache), 30 steps at $H200_5's rates" do_train "$p" 128
            done
            S peers-resnet50-b128 150 80 "estimate: torchvision ResNet-50 (cudnn.benchmark) at batch 128 in 4 precisions, 5 + 30 steps each" do_peers resnet 128 bf16,f16,tf32,f32
            ;;
        2)
            S probe-conv 120 50 "estimate: the quick probe's 7 conv shapes x 3 directions x 4 precisions, searches within 20 s" do_probe_conv
            S peers-conv 90 40 "estimate: PyTorch at the quick probe's 84 conv rows" do_peers_conv
            S probe-fma-full 90 45 "estimate: the full probe's FMA section (samples long enough to reach the power cap: burst against sustained)" do_probe_fma
            S ewa-check-bf16 120 45 "estimate: train --workload ewa --check in bf16 (layers, step, described networks, detector)" do_ewa_check bf16
            S ewa-bf16-a9-b2 75 35 "estimate: detector set-up at 768x1152 and 20 steps at batch 2" do_ewa bf16 9 2
            S ewa-bf16-a3-b2 75 35 "estimate: as ewa-bf16-a9-b2, three anchors a cell" do_ewa bf16 3 2
            S peers-ewa-b2 120 70 "estimate: torchvision Faster R-CNN at 768x1152, batch 2, bf16, at our configuration and its defaults" do_peers ewa 2 bf16
            S resnet50-bf16-b256 75 35 "estimate: as resnet50-bf16-b128, new shapes searched" do_train bf16 256
            S peers-resnet50-b256 90 35 "estimate: torchvision ResNet-50 at batch 256 in bf16" do_peers resnet 256 bf16
            S automl-gpu 60 40 "estimate: a 25 s AutoML search on the GPU with its set-up and calibration" do_automl
            ;;
    esac
}

# A step's measured time from step-times.tsv (name<TAB>seconds<TAB>where), if any.
measured() {
    local f=${ROOFLINE_BRINGUP_TIMES:-$here/step-times.tsv}
    [ -f "$f" ] || [ -n "${ROOFLINE_BRINGUP_TIMES:-}" ] || f=$here/../docs/gpu/step-times.tsv
    [ -f "$f" ] || return 1
    awk -F'\t' -v n="$1" '$1 == n && $2 ~ /^[0-9.]+$/ { print $2 "\t" $3; found = 1 } END { exit !found }' "$f" | tail -1
}

# The estimate of step NAME and its source: its measured time where there is one.
estimate_of() {
    local name=$1 est=$2 src=$3 m
    if m=$(measured "$name"); then
        printf '%s\t%s\n' "$(printf '%.0f' "${m%%$'\t'*}")" "measured: ${m#*$'\t'}"
    else
        printf '%s\t%s\n' "$est" "$src"
    fi
}

plan() {
    local calls=${1:-1 2} call
    for call in $calls; do
        local total=0 n=0
        echo "call $call: budget ${BUDGET} s, ${RESERVE} s kept for the summary"
        printf '  %-22s %6s %9s  %s\n' step limit estimate "where the estimate comes from"
        S() {
            local name=$1 limit=$2 e src
            IFS=$'\t' read -r e src < <(estimate_of "$1" "$3" "$4")
            printf '  %-22s %5ss %8ss  %s\n' "$name" "$limit" "$e" "$src"
            total=$((total + e))
            n=$((n + 1))
        }
        steps_of "$call"
        local room=$((BUDGET - RESERVE))
        echo "  $n steps, estimated ${total} s of the ${room} s the steps may take$([ "$total" -gt "$room" ] && echo ": OVER, the last steps would be skipped")"
        [ "$total" -le "$room" ] || [ "$call" != 1 ] || PLAN_OVER=1
    done
    return "${PLAN_OVER:-0}"
}

pack() {
    set -e
    local root kit bin
    root=$(cd "$here/.." && pwd)
    kit=${ROOFLINE_KIT_DIR:-$root/target/bringup}
    if [ -n "${ROOFLINE_KIT_BINARY:-}" ]; then
        bin=$ROOFLINE_KIT_BINARY
    else
        (cd "$root" && cargo build --release --quiet)
        bin=$root/target/release/roofline
    fi
    rm -rf "$kit"
    mkdir -p "$kit"
    cp "$bin" "$kit/roofline"
    strip "$kit/roofline"
    cp "$root"/scripts/{gpu-bringup.sh,peers.py,conv_peers.py,automl_summary.py,kit_summary.py} "$kit/"
    cp "$root/docs/gpu/summary.schema.json" "$root/docs/gpu/step-times.tsv" "$kit/"
    chmod +x "$kit/roofline" "$kit/gpu-bringup.sh"
    local size
    size=$(du -sb "$kit" | cut -f1)
    echo "kit: $kit ($((size / 1024 / 1024)) MiB): roofline $("$kit/roofline" --version | cut -d' ' -f2) and the scripts"
    echo "on the GPU machine: bash gpu-bringup.sh run OUT 1   (then, with call 1's bundle.tar.gz: ROOFLINE_BRINGUP_FROM=... bash gpu-bringup.sh run OUT 2)"
}

# The CUDA wheels of the Python that holds PyTorch, for roofline's library search, unless the
# caller set ROOFLINE_CUDA_LIBS.
python_wheels() {
    local py
    for py in "${ROOFLINE_PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
        [ -n "$py" ] || continue
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" -c 'import nvidia, os; print(os.pathsep.join(nvidia.__path__))' 2>/dev/null && return
    done
}

# ---- what each step runs (GPU form, and the dry run's CPU form) -------------------------------
# Each writes what it makes into $work; none writes into $out.

gpu_only() {
    if [ "$dry" = 1 ]; then
        echo "dry run: $1 needs a GPU"
        return 200
    fi
}

do_doctor() { gpu_only "doctor's verdict" && "$rl" doctor; }
do_kernels() { gpu_only "NVRTC on this machine (CI's nvrtc_gate compiles every kernel)" && "$rl" kernels --arch 80,89,90; }
do_probe_check() { gpu_only "probe --check" && "$rl" probe --check; }
do_probe_quick() {
    if [ "$dry" = 1 ]; then
        "$rl" probe --device cpu --quick --only fma,gemm -o "$work/machine.json"
    else
        "$rl" probe --device cuda --quick --only fma,mem,gemm,copy -o "$work/machine.json"
    fi
}
do_probe_conv() {
    if [ "$dry" = 1 ]; then
        "$rl" probe --device cpu --quick --only conv -o "$work/machine-conv.json"
    else
        "$rl" probe --device cuda --quick --only conv --conv-search-budget 20 -o "$work/machine-conv.json"
    fi
}
do_probe_fma() {
    if [ "$dry" = 1 ]; then
        "$rl" probe --device cpu --quick --only fma --threads 1 -o "$work/machine-fma.json"
    else
        "$rl" probe --device cuda --only fma -o "$work/machine-fma.json"
    fi
}
do_train_check() { gpu_only "train --check" && "$rl" train --device cuda --precision "$1" --check; }
do_ewa_check() { gpu_only "train --workload ewa --check" && "$rl" train --workload ewa --device cuda --precision "$1" --check; }
# A training's report goes to $work/train/<step>.json; kit_summary.py reads it with the step's
# precision and batch.
do_train() {
    local p=$1 b=$2
    mkdir -p "$work/train"
    if [ "$dry" = 1 ]; then
        # The CPU trainer's f32 at a toy size stands for every precision.
        "$rl" train --device cpu --precision f32 --resolution 32 --width 0.25 --batch 4 --steps 20 --json >"$work/train/$step.json"
    else
        "$rl" train --device cuda --precision "$p" --resolution 224 --batch "$b" --steps 30 --json >"$work/train/$step.json"
    fi
}
do_ewa() {
    local p=$1 a=$2 b=$3
    mkdir -p "$work/train"
    if [ "$dry" = 1 ]; then
        # The CPU detector at a toy size, in f32, stands for the GPU's at 768x1152.
        "$rl" train --workload ewa --device cpu --precision f32 --resolution 64x96 --anchors "$a" --batch 1 --train-images 2 --eval-images 1 --steps 6 --json >"$work/train/$step.json"
    else
        "$rl" train --workload ewa --device cuda --precision "$p" --anchors "$a" --batch "$b" --train-images $((4 * b)) --eval-images 2 --steps 20 --json >"$work/train/$step.json"
    fi
}
# do_peers PART BATCH PRECISIONS: PyTorch's (or torchvision's) figures into $work/peers.json.
do_peers() {
    local part=$1 b=$2 precs=$3 fixture=()
    [ "$dry" = 1 ] && fixture=(--fixture "$fixtures/peers.json")
    if [ "$part" = ewa ]; then
        "$py" "$here/peers.py" --parts ewa --ewa-batch "$b" --precisions "$precs" --steps 10 "${fixture[@]}" -o "$work/peers.json"
    else
        "$py" "$here/peers.py" --parts resnet --batches "$b" --precisions "$precs" --steps 30 "${fixture[@]}" -o "$work/peers.json"
    fi
}
do_peers_conv() {
    local fixture=()
    [ "$dry" = 1 ] && fixture=(--fixture "$fixtures/peers.json")
    "$py" "$here/peers.py" --parts conv --machine "$work/machine-conv.json" "${fixture[@]}" -o "$work/peers.json"
}
do_automl() {
    mkdir -p "$work/automl"
    if [ "$dry" = 1 ]; then
        "$rl" automl --budget 5s --resolution 32 --width 0.25 --train-images 64 --eval-images 32 -o "$work/automl/automl-cpu.json"
    else
        "$rl" automl --device cuda --budget 25s -o "$work/automl/automl-gpu.json"
    fi
}

# ---- the run ----------------------------------------------------------------------------------

run() {
    local out="" call=all
    dry=0
    while [ $# -gt 0 ]; do
        case $1 in
            --dry-run) dry=1 ;;
            1 | 2 | all) call=$1 ;;
            *) [ -z "$out" ] && out=$1 || { echo "run: unexpected argument '$1'"; exit 2; } ;;
        esac
        shift
    done
    out=${out:-${OUT:-./bringup-out}}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    rl=$here/roofline
    [ -x "$rl" ] || rl=${ROOFLINE:-$(command -v roofline || true)}
    [ -x "$rl" ] || { echo "no roofline binary beside this script, in ROOFLINE or on the PATH"; exit 2; }
    py=${ROOFLINE_PYTHON:-python3}
    fixtures=${ROOFLINE_BRINGUP_FIXTURES:-$here/fixtures}
    [ -d "$fixtures" ] || fixtures=$here/../tests/fixtures/bringup
    local clock=${ROOFLINE_BRINGUP_CLOCK:-$([ "$dry" = 1 ] && echo estimate || echo real)}
    # Everything but the four files lives here, and travels in the bundle.
    work=${ROOFLINE_BRINGUP_WORK:-$(mktemp -d)}
    mkdir -p "$work"
    export ROOFLINE_CACHE_DIR=$work/cache
    local from=${ROOFLINE_BRINGUP_FROM:-}
    [ -d "$from" ] && from=$from/bundle.tar.gz
    if [ -n "$from" ]; then
        if [ -f "$from" ]; then
            # Call 1's machine file and cuDNN algorithm cache.
            tar xzf "$from" -C "$work" ./machine.json ./cache 2>/dev/null
            [ -f "$work/machine.json" ] && mv "$work/machine.json" "$work/machine-call1.json"
        else
            echo "ROOFLINE_BRINGUP_FROM=$from: no such bundle; call 2 goes on without call 1's files"
        fi
    fi
    if [ "$dry" = 0 ] && [ -z "${ROOFLINE_CUDA_LIBS:-}" ] && ! "$rl" doctor >/dev/null 2>&1; then
        ROOFLINE_CUDA_LIBS=$(python_wheels)
        export ROOFLINE_CUDA_LIBS
    fi
    local log=$work/log.txt steps=$work/steps.jsonl
    : >"$log"
    : >"$steps"
    local start=$SECONDS charged=0 failed=0 writes=0
    {
        echo "roofline bring-up, call $call$([ "$dry" = 1 ] && echo ', dry run on the CPU'), on $(hostname), $(date -u +%FT%TZ)"
        echo "roofline: $("$rl" --version 2>&1); ROOFLINE_CUDA_LIBS=${ROOFLINE_CUDA_LIBS:-(unset)}; budget ${BUDGET} s, reserve ${RESERVE} s, clock $clock"
        nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv 2>&1
    } >>"$log"

    # The call's four files, rewritten now: the log's tail and the bundle first, the summary
    # last, so that a summary that shows a step holds no more than the files beside it.
    publish() {
        writes=$((writes + 1))
        tail -c 65536 "$log" >"$out/.log-tail.txt" && mv "$out/.log-tail.txt" "$out/log-tail.txt"
        # The candidates' weights never travel (tens of MB, and nothing reads them here).
        tar czf "$out/.bundle.tar.gz" -C "$work" --exclude '*.weights' . 2>/dev/null
        if [ "$(stat -c %s "$out/.bundle.tar.gz" 2>/dev/null || echo 0)" -gt $((16 * 1024 * 1024)) ]; then
            # Over 16 MiB: the algorithm cache out, then the log (its tail is beside it).
            tar czf "$out/.bundle.tar.gz" -C "$work" --exclude '*.weights' --exclude ./cache --exclude ./log.txt . 2>/dev/null
        fi
        mv "$out/.bundle.tar.gz" "$out/bundle.tar.gz"
        "$py" "$here/kit_summary.py" --work "$work" --out "$out" --call "$call" --budget "$BUDGET" \
            --reserve "$RESERVE" --clock "$clock" --spent "$(spent)" --writes "$writes" \
            $([ "$dry" = 1 ] && echo --dry-run) >>"$log" 2>&1 ||
            echo "kit_summary.py failed (see the log)" >>"$log"
    }
    # Seconds the budget has spent: real, or (the estimate clock) the steps' estimates.
    spent() {
        if [ "$clock" = estimate ]; then echo "$charged"; else echo $((SECONDS - start)); fi
    }
    # One line of steps.jsonl (kit_summary.py turns them into the summary's steps[]).
    note() {
        "$py" -c 'import json, sys; print(json.dumps(dict(zip(sys.argv[1::2], sys.argv[2::2]))))' "$@" >>"$steps"
    }
    S() {
        step=$1
        local limit=$2 fn=$5 e src
        IFS=$'\t' read -r e src < <(estimate_of "$1" "$3" "$4")
        shift 5
        # A step starts only where it can finish: on the estimate clock where its estimate
        # fits, on the real one where half of it does (the time goes to the cheaper steps after).
        local left=$((BUDGET - RESERVE - $(spent))) need
        need=$([ "$clock" = estimate ] && echo "$e" || echo $((e / 2)))
        if [ "$left" -lt 5 ] || [ "$need" -gt "$left" ]; then
            echo "== $step: skipped, ${left} s left of the budget" >>"$log"
            note name "$step" status skipped limit_s "$limit" estimate_s "$e" source "$src" \
                why "the call's budget was spent (${left} s left before the summary's ${RESERVE} s)" args "$*"
            failed=$((failed + 1))
            return
        fi
        [ "$limit" -gt "$left" ] && limit=$left
        note name "$step" status running limit_s "$limit" estimate_s "$e" source "$src" args "$*"
        echo "== $step (limit ${limit} s): $fn $*" >>"$log"
        publish
        local t0=$SECONDS part rc
        part=$(mktemp)
        if [[ ",${ROOFLINE_BRINGUP_FAIL:-}," == *",$step,"* ]]; then
            echo "error: failed on purpose (ROOFLINE_BRINGUP_FAIL)" >"$part"
            rc=99
        elif [[ ",${ROOFLINE_BRINGUP_HANG:-}," == *",$step,"* ]]; then
            # The kit's test kills a call here, mid-step.
            sleep 600
            rc=$?
        else
            # A function in a shell of its own, under the limit: SIGINT first, then SIGKILL.
            export -f "$fn" gpu_only
            export rl py work dry step here fixtures
            timeout --signal=INT --kill-after=10 "$limit" bash -c "$fn \"\$@\"" "$fn" "$@" >"$part" 2>&1
            rc=$?
        fi
        cat "$part" >>"$log"
        local took=$((SECONDS - t0)) status why=""
        if [ "$clock" = estimate ]; then charged=$((charged + e)); else charged=$((SECONDS - start)); fi
        case $rc in
            0) status=pass ;;
            200) status=skipped why=$(tail -1 "$part") ;;
            124 | 130 | 137) status=fail why="timed out after ${limit} s" ;;
            *)
                status=fail
                why=$(grep -m1 -E 'roofline: error|error:|Error|FAILED|failed' "$part" || tail -1 "$part")
                why="exit $rc: $(echo "$why" | cut -c1-300)"
                ;;
        esac
        [ "$status" = fail ] && failed=$((failed + 1))
        echo "== $step: $status after ${took} s${why:+ ($why)}" >>"$log"
        rm -f "$part"
        note name "$step" status "$status" seconds "$took" limit_s "$limit" estimate_s "$e" source "$src" why "$why" args "$*"
        publish
    }
    local c
    for c in $([ "$call" = all ] && echo 1 2 || echo "$call"); do
        # Each call has a budget of its own.
        start=$SECONDS charged=0
        echo "== call $c" >>"$log"
        steps_of "$c"
    done
    publish
    echo "failed or skipped for want of time: $failed; $(spent) s of the ${BUDGET} s budget ($((SECONDS - start)) s on the clock)" >>"$out/summary.txt"
    cat "$out/summary.txt"
    [ -n "${ROOFLINE_BRINGUP_WORK:-}" ] || rm -rf "$work"
    return "$failed"
}

case "${1:-}" in
    pack) pack ;;
    plan) shift; plan "$@" ;;
    run) shift; run "$@" ;;
    *)
        sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 2
        ;;
esac
