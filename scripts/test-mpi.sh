#!/usr/bin/env bash
# The MPI half of the tests: builds with `--features mpi` and runs tests/mpi.rs under mpirun
# (2 and 4 ranks, two pretend nodes, TCP only, a stalled rank). Needs Open MPI and libclang
# (Debian: openmpi-bin libopenmpi-dev libclang-dev; .ci/run installs them). Without them it
# says so and skips, except under CI=true, where it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    msg="no MPI (mpirun, mpicc): the MPI tests need openmpi-bin libopenmpi-dev libclang-dev"
    if [ "${CI:-}" = "true" ]; then
        echo "error: CI=true and $msg" >&2
        exit 1
    fi
    echo "skipped: $msg"
    [ -n "${ROOFLINE_SKIPPED:-}" ] && echo "the MPI tests: $msg" >>"$ROOFLINE_SKIPPED"
    exit 0
fi
# --workspace: the features scripts/test.sh builds with, so that nothing is built twice.
cargo clippy --workspace --all-targets --features mpi -- -D warnings
cargo test --workspace --features mpi --test mpi --test mpi_fleet
