#!/usr/bin/env bash
# Bring roofline's GPU path up on a GPU machine in one sitting.
#
#   scripts/gpu-bringup.sh pack            # here (any x86-64 Linux with Rust): build the kit
#   scripts/gpu-bringup.sh run [OUT] [PARTS]   # on the GPU machine, from the kit's folder
#
# pack builds a release binary (no MPI: it must start on a machine without an MPI library),
# strips it, and puts it with this script and peers.py into target/bringup/ (about 8 MB;
# ROOFLINE_KIT_DIR sets another folder, ROOFLINE_KIT_BINARY packs a binary already built).
# Copy that folder to the GPU machine and run `bash gpu-bringup.sh run OUT` there. It needs no
# Rust and no network: the NVIDIA driver, the CUDA libraries (a toolkit, or the pip wheels of
# CUDA 12 or 13, e.g. those PyTorch installs), and for the peer figures PyTorch.
#
# run does, in order, each step under its own time limit and the whole under
# ROOFLINE_BRINGUP_BUDGET seconds (default 540): doctor; kernels (NVRTC's resource report on
# this machine's NVRTC); probe --check (every GPU kernel against its CPU reference); a quick GPU
# probe, then the full one; train --check in f32, tf32, bf16 and f16 (every GPU layer and a
# whole step against the CPU, NCCL on one rank; the reduced precisions against the CPU reference
# with the GPU's rounding points); ResNet-50 at 224² for f32, tf32, bf16, f16 at batches 128 and 256
# (ROOFLINE_BRINGUP_BATCHES), each with its host waits per step and joules per image; place
# --workload resnet50 (bf16, the first batch: the per-layer table and the idle share); and the
# peers PyTorch gives on the same GPU in the same call (matmul TFLOP/s at the probe's GEMM
# shapes, a device-to-device copy, ResNet-50 training images/s at the same batches and
# precisions); then EWA's detector: train --workload ewa --check (f32, bf16), short trainings at
# 768x1152 (f32, bf16, batch 2), place --workload ewa (its table in the log), and torchvision's
# Faster R-CNN training step at the same size as its peer; then AIPerf's AutoML (automl): the
# described networks' check, a short search on the CPU and on the GPUs (f16, a worker a GPU),
# one from ResNet-50 at 224² (its FLOPS a GPU against AIPerf's published 1.75 TOPS a T4), and
# its best candidate placed. It writes at most 8 files into OUT
# (default ./bringup-out: log.txt, machine.json, train.jsonl, placement.json and .svg,
# peers.json, summary.txt, summary.json) and prints summary.txt last: roofline's figures beside
# the peers'. summary.json is the record to commit as docs/gpu/<date>-<gpu>.json: revision,
# GPU, driver, libraries, and per precision and batch our images/s, PyTorch's, the ratio, host
# waits per step, joules per image and the idle share where placed. A failed step is recorded and the
# next one runs; the exit code is the number of failed steps (0: all passed).
# Every file is written as the run goes (a time-out keeps what finished): summary.txt gets one
# line per step as it ends — pass, FAIL (exit code, time-out, the error's line) or skipped
# (why: the budget spent, the part not asked) — and the peers' table at the end. A part that
# needs ceilings (train, ewa, peers) and has no machine.json from this call takes
# ROOFLINE_BRINGUP_MACHINE (an earlier call's machine.json) or a quick probe, never a second
# full one. ROOFLINE_BRINGUP_PROBE_LIMIT (360) and ROOFLINE_BRINGUP_TRAIN_LIMIT (180) cap the
# full probe (0 skips it) and each of the four trainings, so that a short lease reaches the
# later steps.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)

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
    cp "$root/scripts/gpu-bringup.sh" "$root/scripts/peers.py" "$root/scripts/conv_peers.py" "$root/scripts/automl_summary.py" "$kit/"
    chmod +x "$kit/roofline" "$kit/gpu-bringup.sh"
    local size
    size=$(du -sb "$kit" | cut -f1)
    echo "kit: $kit ($((size / 1024 / 1024)) MiB): roofline $("$kit/roofline" --version | cut -d' ' -f2), gpu-bringup.sh, peers.py, conv_peers.py, automl_summary.py"
    echo "on the GPU machine: bash gpu-bringup.sh run OUT"
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

run() {
    local out=${1:-${OUT:-./bringup-out}}
    # Which parts: all (default), or a comma list of probe (doctor, kernels, the checks and
    # probes), check (train --check in f32, tf32, bf16, f16), train (the trainings, place),
    # peers (PyTorch), ewa (the detector's --check, two trainings at 768x1152, place) and
    # ewa-peers (torchvision's Faster R-CNN) and automl (AIPerf's search on the CPU and the
    # GPUs), so that a machine lent in calls of 10 minutes can take it in four: `run OUT
    # probe,check`, `run OUT train,peers` (ResNet-50 against PyTorch: under 6 minutes with
    # ROOFLINE_BRINGUP_BUDGET=330), `run OUT ewa,ewa-peers`, `run OUT automl`.
    local parts=${2:-all}
    want() { [ "$parts" = all ] || [[ ",$parts," == *",$1,"* ]]; }
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    local rl=$here/roofline
    [ -x "$rl" ] || rl=$(command -v roofline || true)
    [ -x "$rl" ] || { echo "no roofline binary beside this script or on the PATH"; exit 2; }
    local py=${ROOFLINE_PYTHON:-python3}
    # PyTorch's wheels only where roofline finds no consistent set by itself (a toolkit on the
    # linker's path is taken first; naming the wheels then would contradict it).
    if [ -z "${ROOFLINE_CUDA_LIBS:-}" ] && ! "$rl" doctor >/dev/null 2>&1; then
        ROOFLINE_CUDA_LIBS=$(python_wheels)
        export ROOFLINE_CUDA_LIBS
    fi
    local budget=${ROOFLINE_BRINGUP_BUDGET:-540}
    local start=$SECONDS failed=0
    local log=$out/log.txt summary=$out/summary.txt
    : >"$log"
    : >"$out/train.jsonl"
    echo "roofline bring-up, parts: $parts; one line per step as it ends" >"$summary"
    # record NAME STATUS WHY: one line of the summary, written at once.
    record() { printf '%-16s %-8s %s\n' "$1" "$2" "$3" >>"$summary"; }
    # not_asked PART STEP...: the steps of a part this run does not take.
    not_asked() {
        local part=$1
        shift
        want "$part" && return 1
        local s
        for s in "$@"; do record "$s" skipped "part '$part' not in this run"; done
        return 0
    }
    echo "roofline bring-up on $(hostname), $(date -u +%FT%TZ); ROOFLINE_CUDA_LIBS=${ROOFLINE_CUDA_LIBS:-(unset)}" | tee -a "$log"
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv 2>&1 | tee -a "$log"

    # step NAME LIMIT CMD...: runs CMD with LIMIT seconds (less if the budget is nearly spent),
    # output into the log, and records the outcome.
    step() {
        local name=$1 limit=$2
        shift 2
        local left=$((budget - (SECONDS - start)))
        if [ "$left" -le 5 ]; then
            echo "== $name: skipped, the budget of ${budget}s is spent" | tee -a "$log"
            record "$name" skipped "the budget of ${budget}s was spent (ROOFLINE_BRINGUP_BUDGET)"
            failed=$((failed + 1))
            return 1
        fi
        [ "$limit" -gt "$left" ] && limit=$left
        echo "== $name (limit ${limit}s)" | tee -a "$log"
        local t0=$SECONDS part
        part=$(mktemp)
        timeout --signal=INT --kill-after=10 "$limit" "$@" >"$part" 2>&1
        local rc=$?
        cat "$part" >>"$log"
        echo "== $name: exit $rc after $((SECONDS - t0))s" | tee -a "$log"
        if [ "$rc" = 0 ]; then
            record "$name" pass "$((SECONDS - t0))s"
        else
            local why
            why=$(grep -m1 -E 'roofline: error|error:|Error|FAILED|failed' "$part" | cut -c1-300)
            case $rc in
                124 | 130 | 137) why="timed out after ${limit}s${why:+; $why}" ;;
                *) why="exit $rc after $((SECONDS - t0))s${why:+: $why}" ;;
            esac
            record "$name" FAIL "$why"
            failed=$((failed + 1))
        fi
        rm -f "$part"
        return "$rc"
    }

    step doctor 60 "$rl" doctor
    local tmp machine=$out/machine.json
    tmp=$(mktemp -d)
    if ! not_asked probe kernels probe-check probe-quick probe-full; then
        step kernels 120 "$rl" kernels --arch 80,89,90
        step probe-check 180 "$rl" probe --check
        step probe-quick 240 "$rl" probe --device cuda --quick -o "$tmp/machine-quick.json"
        if [ "${ROOFLINE_BRINGUP_PROBE_LIMIT:-360}" = 0 ]; then
            record probe-full skipped "ROOFLINE_BRINGUP_PROBE_LIMIT=0 (the quick probe's ceilings are used)"
        else
            step probe-full "${ROOFLINE_BRINGUP_PROBE_LIMIT:-360}" "$rl" probe --device cuda -o "$machine"
        fi
    fi
    # A part with placements and no probe of its own in this call: an earlier call's file, or a
    # quick probe (never a second full one).
    if [ ! -f "$machine" ] && [ -n "${ROOFLINE_BRINGUP_MACHINE:-}" ] && [ -f "$ROOFLINE_BRINGUP_MACHINE" ]; then
        cp "$ROOFLINE_BRINGUP_MACHINE" "$machine"
        record machine pass "taken from ROOFLINE_BRINGUP_MACHINE=$ROOFLINE_BRINGUP_MACHINE"
    fi
    # At most 8 files come back from a lent machine: the quick probe's only if there is no full one.
    if [ ! -f "$machine" ]; then
        if [ ! -f "$tmp/machine-quick.json" ] && { want train || want peers || want ewa; }; then
            step probe-quick 180 "$rl" probe --device cuda --quick -o "$tmp/machine-quick.json"
        fi
        if [ -f "$tmp/machine-quick.json" ]; then
            cp "$tmp/machine-quick.json" "$out/"
            machine=$out/machine-quick.json
        fi
    fi
    local batch=${ROOFLINE_BRINGUP_BATCH:-128} steps=${ROOFLINE_BRINGUP_STEPS:-30}
    # ResNet-50 is trained (and its peer measured) at each of these batches; the placement at
    # the first.
    local batches=${ROOFLINE_BRINGUP_BATCHES:-$batch 256}
    if ! not_asked check train-check train-check-tf32 train-check-bf16 train-check-f16; then
        # Every GPU layer and a whole step against the CPU in each precision: f32 against the
        # CPU model, the others against the CPU reference with the GPU's rounding points.
        step train-check 240 "$rl" train --device cuda --check
        for p in tf32 bf16 f16; do
            step "train-check-$p" 120 "$rl" train --device cuda --precision "$p" --check
        done
    fi
    if ! not_asked train train place; then
        for b in $batches; do
            for p in f32 tf32 bf16 f16; do
                step "train-$p-b$b" "${ROOFLINE_BRINGUP_TRAIN_LIMIT:-180}" sh -c "'$rl' train --device cuda --precision $p --resolution 224 --batch $b --steps $steps --json >'$out/train-$p.json'"
                [ -s "$out/train-$p.json" ] && { tr -d '\n' <"$out/train-$p.json"; echo; } >>"$out/train.jsonl"
                rm -f "$out/train-$p.json"
            done
        done
        step place 240 "$rl" place --workload resnet50 --device cuda --precision bf16 --resolution 224 --batch "$batch" --machine "$machine" -o "$out/placement.json"
    fi
    if ! not_asked ewa ewa-check ewa-check-bf16 ewa-f32 ewa-bf16 ewa-f32-a9 ewa-bf16-a9 ewa-f32-a3 ewa-bf16-a3 ewa-f32-a9-b8 ewa-bf16-a9-b8 ewa-bf16-a9-host-rpn ewa-place; then
        # The detector: every GPU layer and a whole step of a small detector against the CPU,
        # then short trainings at the paper's 768x1152 (synthetic fields), batch 2, and its
        # placement on the GPU roofline (table in the log).
        step ewa-check 240 "$rl" train --workload ewa --device cuda --check
        step ewa-check-bf16 240 "$rl" train --workload ewa --device cuda --precision bf16 --check
        # At our nine anchors a cell, then at torchvision's default three (--anchors 3): the
        # summary holds each to torchvision's Faster R-CNN at the same configuration.
        for a in 9 3; do
            for p in f32 bf16; do
                step "ewa-$p-a$a" 240 sh -c "'$rl' train --workload ewa --device cuda --precision $p --anchors $a --batch 2 --train-images 8 --eval-images 2 --steps 12 --json >'$out/ewa-$p.json'"
                [ -s "$out/ewa-$p.json" ] && { tr -d '\n' <"$out/ewa-$p.json"; echo; } >>"$out/train.jsonl"
                rm -f "$out/ewa-$p.json"
            done
        done
        # Batch 8 at our configuration, each precision (fewer steps: four times the images).
        for p in f32 bf16; do
            step "ewa-$p-a9-b8" 240 sh -c "'$rl' train --workload ewa --device cuda --precision $p --anchors 9 --batch 8 --train-images 32 --eval-images 2 --steps 6 --json >'$out/ewa-$p.json'"
            [ -s "$out/ewa-$p.json" ] && { tr -d '\n' <"$out/ewa-$p.json"; echo; } >>"$out/train.jsonl"
            rm -f "$out/ewa-$p.json"
        done
        # A/B: the RPN's losses and proposals and the box head's losses on the host from the
        # downloaded outputs, as before detect.cu (bf16, nine anchors; its images/s in the log
        # beside ewa-bf16-a9's).
        step ewa-bf16-a9-host-rpn 240 env ROOFLINE_HOST_RPN=1 "$rl" train --workload ewa --device cuda --precision bf16 --anchors 9 --batch 2 --train-images 8 --eval-images 2 --steps 12
        step ewa-place 240 "$rl" place --workload ewa --device cuda --precision bf16 --batch 2 --train-images 8 --machine "$machine" -o "$out/placement-ewa.json"
    fi
    if ! not_asked peers peers; then
        step peers 300 "$py" "$here/peers.py" --batch "$batch" --batches "$(echo $batches | tr ' ' ,)" --steps "$steps" -o "$out/peers.json"
    fi
    if ! not_asked peers conv-peers; then
        # PyTorch's convolutions at every shape of the probe's conv tables (the summary gives
        # roofline/PyTorch per shape and direction).
        step conv-peers 240 "$py" "$here/peers.py" --parts conv --machine "$machine" -o "$out/peers.json"
    fi
    local automl=()
    if ! not_asked automl automl-check automl-cpu automl-gpu automl-gpu-224 automl-place; then
        # AIPerf's AutoML: the described networks' GPU step against the CPU (f32 and f16, every
        # morphism; part of train-check when the check part runs too), then the same short
        # search on the CPU's cores and on the GPUs (one worker a GPU, f16), and one from
        # ResNet-50 at 224² (AIPerf's network and size, synthetic images) for its FLOPS a GPU
        # against AIPerf's published figure; its best candidate placed on the GPU roofline.
        # The searches write beside their json (weights, report): only the json comes back.
        want check || step automl-check 240 "$rl" train --device cuda --precision f16 --check
        step automl-cpu 120 "$rl" automl --budget "${ROOFLINE_BRINGUP_AUTOML_S:-60}s" -o "$tmp/automl-cpu.json"
        step automl-gpu 120 "$rl" automl --device cuda --budget "${ROOFLINE_BRINGUP_AUTOML_S:-60}s" -o "$tmp/automl-gpu.json"
        step automl-gpu-224 240 "$rl" automl --device cuda --resolution 224 --width 1 --depth 3,4,6,3 --classes 100 --train-images 2048 --eval-images 256 --batch 128 --budget "${ROOFLINE_BRINGUP_AUTOML_224_S:-150}s" -o "$tmp/automl-224.json"
        [ -f "$tmp/automl-gpu.json" ] && step automl-place 180 "$rl" place --workload "automl:$tmp/automl-gpu.json" --device cuda --precision f16 --machine "$machine" -o "$tmp/placement-automl.json"
        for f in automl-cpu automl-gpu automl-224; do
            [ -f "$tmp/$f.json" ] && cp "$tmp/$f.json" "$out/" && automl+=(--automl "$out/$f.json")
        done
    fi
    if ! not_asked ewa-peers ewa-peers; then
        step ewa-peers 420 "$py" "$here/peers.py" --parts ewa --ewa-batch 2,8 --steps 10 -o "$out/peers.json"
    fi
    echo >>"$summary"
    if [ -f "$out/peers.json" ] || [ "${#automl[@]}" -gt 0 ]; then
        "$py" "$here/peers.py" --summary --machine "$machine" --train "$out/train.jsonl" --peers "$out/peers.json" \
            --placement "$out/placement.json" --placement "$out/placement-ewa.json" "${automl[@]}" --json "$out/summary.json" >>"$summary" 2>>"$log" \
            || echo "no peer table (see log.txt)" >>"$summary"
    else
        echo "no peer figures in this run (part: $parts)" >>"$summary"
    fi
    rm -rf "$tmp"
    echo "failed steps: $failed; total $((SECONDS - start))s" >>"$summary"
    cat "$summary"
    return "$failed"
}

case "${1:-}" in
    pack) pack ;;
    run) shift; run "$@" ;;
    *)
        sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 2
        ;;
esac
