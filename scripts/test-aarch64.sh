#!/usr/bin/env bash
# The Arm half of the tests (aarch64 Linux hosts: NVIDIA Grace, AWS Graviton): clippy for
# aarch64-unknown-linux-gnu on the crates that hold Arm code, then the CPU kernels' and the data
# model's unit tests cross-built and run under qemu-user (NEON kernels, their result checks, the
# ISA dispatch).
# Needs the Rust target (rustup target add aarch64-unknown-linux-gnu) and Debian's qemu-user,
# gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (.ci/run installs them). Without them it says
# so and skips, except under CI=true, where it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
missing=""
rustup target list --installed 2>/dev/null | grep -qx "$TARGET" || missing="$missing rust-std($TARGET)"
for tool in qemu-aarch64 aarch64-linux-gnu-gcc; do
    command -v "$tool" >/dev/null || missing="$missing $tool"
done
if [ -n "$missing" ]; then
    msg="missing for the aarch64 tests:$missing (rustup target add $TARGET; apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)"
    if [ "${CI:-}" = "true" ]; then
        echo "error: CI=true and $msg" >&2
        exit 1
    fi
    echo "skipped: $msg"
    exit 0
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export ROOFLINE_TEST_CC=aarch64-linux-gnu-gcc
# Only roofline-kernels (the NEON kernels, the dispatch) and roofline-nn (the tensor engine's
# x86-only paths and their fallbacks) hold code that differs by target (`target_arch`); every
# other crate compiles to the same code on both, so its findings are the x86 clippy's, which
# scripts/test.sh runs (on a clean clone here, the whole workspace took 62 s, these two 34 s).
cargo clippy -p roofline-kernels -p roofline-nn --all-targets --target "$TARGET" -- -D warnings
cargo test --target "$TARGET" -p roofline-kernels -p roofline-model --lib
