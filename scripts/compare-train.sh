#!/usr/bin/env bash
# ResNet-50 v1.5 CPU training, roofline beside TensorFlow and PyTorch in the same run (issue 34):
# same model, batch, resolution and threads, f32 and bf16 mixed precision, interleaved in rounds
# (clocks and the host's load drift on virtual machines), best of the rounds for every figure.
#
#   roofline   train --precision f32|bf16 --json: steady_images_per_second (the steps after the
#              first); bf16 needs AVX512_BF16 (one line and exit 2 elsewhere: the row says so)
#   PyTorch    torchvision resnet50, channels-last; bf16: torch.autocast("cpu", bfloat16)
#   TensorFlow the same network in Keras layers, oneDNN; bf16: the mixed_bfloat16 policy
#   (scripts/train_peers.py: the peers' side, one process per framework and precision)
#
# Needs: torch, torchvision and tensorflow-cpu in $PYTHON (default python3), e.g.
#   python3 -m venv /tmp/pv && /tmp/pv/bin/pip install torch torchvision tensorflow-cpu
#   PYTHON=/tmp/pv/bin/python scripts/compare-train.sh
# Missing peers are reported and skipped.
# Usage: scripts/compare-train.sh [rounds=1] [batch=32] [resolution=224] [steps=4]
#        (about 4 minutes a round at the defaults on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
BATCH=${2:-32}
RES=${3:-224}
STEPS=${4:-4}
PY=${PYTHON:-python3}
THREADS=$(nproc)
OUT=compare-out
mkdir -p "$OUT"
cargo build --release --quiet || exit 1
BIN=target/release/roofline
# The revision once, at the start: the tree may be edited while the rounds run.
REV=$(git describe --always --dirty --abbrev=7)
echo "# scripts/compare-train.sh $ROUNDS $BATCH $RES $STEPS — $(date -u +%F), revision $REV, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $THREADS CPUs, bf16 instruction: $(grep -qw avx512_bf16 /proc/cpuinfo && echo AVX512_BF16 || echo none)"
echo "# ResNet-50 v1.5, batch $BATCH, ${RES}x$RES, $THREADS threads, 1 warm-up step then $STEPS measured; images/s over the measured steps"
have_torch=0; $PY -c "import torch, torchvision" 2>/dev/null && have_torch=1
have_tf=0; $PY -c "import tensorflow" 2>/dev/null && have_tf=1
[ $have_torch = 1 ] || echo "torch/torchvision not found in $PY: skipping PyTorch"
[ $have_tf = 1 ] || echo "tensorflow not found in $PY: skipping TensorFlow"

RESULTS="$OUT/train-results.txt"
: > "$RESULTS"
roofline() { # precision
    local j
    j=$("$BIN" train --workload resnet50 --synthetic --batch "$BATCH" --resolution "$RES" \
        --steps $((STEPS + 1)) --threads "$THREADS" --precision "$1" --json 2>"$OUT/train-roofline-$1.err")
    if [ $? -ne 0 ]; then
        echo "roofline $1: $(tail -1 "$OUT/train-roofline-$1.err")"
        return
    fi
    echo "$j" | $PY -c "import json,sys; d=json.load(sys.stdin); print('roofline', '$1', d['steady_images_per_second'], d['parameters'], 'roofline-' + '$REV')" >> "$RESULTS"
}
peer() { # framework precision
    local j
    j=$($PY scripts/train_peers.py --framework "$1" --precision "$2" --batch "$BATCH" \
        --resolution "$RES" --threads "$THREADS" --steps "$STEPS" 2>"$OUT/train-$1-$2.err")
    if [ $? -ne 0 ] || [ -z "$j" ]; then
        echo "$1 $2 failed: $(grep -v '^[WI]0' "$OUT/train-$1-$2.err" | tail -1)"
        return
    fi
    echo "$j" | $PY -c "import json,sys; d=json.load(sys.stdin); v=d['versions']; print('$1', '$2', d['images_per_second'], d['parameters'], '+'.join(k + '-' + str(x) for k, x in v.items() if k in ('torch', 'tensorflow')))" >> "$RESULTS"
}
for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r/$ROUNDS"
    for prec in f32 bf16; do
        roofline "$prec"
        [ $have_torch = 1 ] && OMP_NUM_THREADS=$THREADS peer torch "$prec"
        [ $have_tf = 1 ] && TF_CPP_MIN_LOG_LEVEL=2 peer tf "$prec"
    done
done
echo
echo "best of rounds (images/s), and roofline's ratio to the best peer in each precision:"
$PY - "$RESULTS" <<'PYEOF'
import sys, collections
best, params, ver = {}, {}, {}
for line in open(sys.argv[1]):
    who, prec, ips, n, v = line.split()
    key = (who, prec)
    best[key] = max(best.get(key, 0.0), float(ips))
    params[key], ver[key] = int(n), v
names = {"roofline": "roofline", "torch": "PyTorch", "tf": "TensorFlow"}
for prec in ["f32", "bf16"]:
    rows = [(w, best[(w, prec)]) for w in ["roofline", "torch", "tf"] if (w, prec) in best]
    for w, ips in rows:
        print(f"  {prec:5} {names[w]:11} {ips:7.2f} images/s   ({params[(w, prec)]:,} parameters; {ver[(w, prec)]})")
    peers = [ips for w, ips in rows if w != "roofline"]
    if ("roofline", prec) in best and peers:
        print(f"  {prec:5} roofline / best peer = {best[('roofline', prec)] / max(peers):.2f}")
if ("roofline", "f32") in best:
    f32_peers = [best[(w, "f32")] for w in ["torch", "tf"] if (w, "f32") in best]
    if ("roofline", "bf16") in best:
        print(f"  roofline bf16 / roofline f32 = {best[('roofline', 'bf16')] / best[('roofline', 'f32')]:.2f}")
    if f32_peers and ("roofline", "bf16") in best:
        print(f"  roofline bf16 / best f32 peer = {best[('roofline', 'bf16')] / max(f32_peers):.2f}")
PYEOF
