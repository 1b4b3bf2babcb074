#!/usr/bin/env bash
# The tests, as the README's second command runs them: set-up where no root is needed (NVRTC
# from NVIDIA's pip wheels into .venv-cuda), formatting, lints, every test of the workspace
# and the MPI tests (one build, `--features mpi`, where Open MPI is here); then what was
# skipped for want of a tool, and the one command that installs it. Variables already set (ROOFLINE_CUDA_LIBS, ROOFLINE_NVDISASM, CI) are kept: .ci/run sets
# them, and under CI=true a missing tool fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
export ROOFLINE_SKIPPED="$PWD/target/skipped-tests.txt"
: >"$ROOFLINE_SKIPPED"
# shellcheck source=scripts/cuda-wheels.sh
. scripts/cuda-wheels.sh
if [ -z "${ROOFLINE_CUDA_LIBS:-}" ]; then
    libs=""
    if python3 -m venv --help >/dev/null 2>&1; then
        if wheels .venv-cuda "$CUDA12_WHEELS" 2>/dev/null; then
            libs=$(nvidia_path .venv-cuda)
        else
            echo "note: could not install the NVRTC wheels into .venv-cuda (no network?)" >&2
        fi
    fi
    # The CUDA 13 wheels where scripts/install-test-tools.sh --cuda13 put them.
    if [ -x .venv-cuda13/bin/python ]; then
        n13=$(nvidia_path .venv-cuda13)
        libs="${libs:+$libs:}$n13"
        export ROOFLINE_NVDISASM="${ROOFLINE_NVDISASM:-$n13/cu13/bin/nvdisasm}"
    fi
    if [ -n "$libs" ]; then export ROOFLINE_CUDA_LIBS="$libs"; fi
fi
# With Open MPI here, one build serves every test: the workspace is tested with `--features
# mpi`, which runs the MPI tests (tests/mpi.rs, tests/mpi_fleet.rs under mpirun) in the same
# pass; the default build (no MPI) is still linted. Without it, scripts/test-mpi.sh says so.
mpi=()
if command -v mpirun >/dev/null && command -v mpicc >/dev/null; then
    mpi=(--features mpi)
fi
# Each step's start, in seconds since the tests began (CI's log says where the minutes go).
step() { echo "[test.sh ${SECONDS}s] $*"; }
step "fmt"
cargo fmt --check
step "clippy"
cargo clippy --workspace --all-targets -- -D warnings
if [ ${#mpi[@]} -gt 0 ]; then
    step "clippy with MPI"
    cargo clippy --workspace --all-targets "${mpi[@]}" -- -D warnings
    step "cargo test (build, then every test binary)"
    cargo test --workspace "${mpi[@]}"
else
    cargo test --workspace
    scripts/test-mpi.sh
fi
# The real-cluster harness: four hosts as network namespaces on a bridge, Open MPI across
# them over TCP, Slurm with a slurmd per host (scripts/cluster.sh test, about 3½ minutes). It
# needs root and the MPI build; Slurm is required under CI=true, else skipped when missing.
if [ ${#mpi[@]} -eq 0 ]; then
    echo "the cluster harness (scripts/cluster.sh test): needs Open MPI" >>"$ROOFLINE_SKIPPED"
elif [ "$(id -u)" != 0 ]; then
    echo "the cluster harness (scripts/cluster.sh test): needs root (network namespaces)" >>"$ROOFLINE_SKIPPED"
elif ! { ip netns add rl-can-i 2>/dev/null && ip netns del rl-can-i; }; then
    if [ "${CI:-}" = true ]; then
        echo "CI=true and network namespaces cannot be made here (ip netns add failed)" >&2
        exit 1
    fi
    echo "the cluster harness (scripts/cluster.sh test): ip netns add is refused here (a container without CAP_SYS_ADMIN?)" >>"$ROOFLINE_SKIPPED"
else
    step "the cluster harness"
    ROOFLINE="$PWD/target/debug/roofline" scripts/cluster.sh test
fi
step "end"
if [ -s "$ROOFLINE_SKIPPED" ]; then
    echo
    echo "PASSED, but these checks were skipped (a tool is missing here):"
    sort -u "$ROOFLINE_SKIPPED" | sed 's/^/  - /'
    echo "install what they need (Debian packages as root or with sudo, and pip wheels), then run the tests again:"
    echo "  scripts/install-test-tools.sh --cuda13"
else
    echo
    echo "PASSED; nothing was skipped"
fi
