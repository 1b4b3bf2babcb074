#!/usr/bin/env bash
# Installs what the tests use beyond Rust, so that none of them is skipped:
#   - Open MPI and libclang (the MPI tests, scripts/test-mpi.sh), Chromium (every figure
#     checked in a browser), and Slurm with munge (the cluster harness, scripts/cluster.sh),
#     from Debian's packages: as root, or through sudo;
#   - NVRTC 12.4, ptxas and the CUDA runtime headers (the kernel gate) from NVIDIA's pip
#     wheels into .venv-cuda;
#   - with --cuda13, also CUDA 13's NVRTC, cuBLAS, cuDNN, NCCL and nvdisasm into .venv-cuda13
#     (about 1.3 GB: the SASS gate and the CUDA library gate).
# No GPU and no driver are needed. scripts/test.sh finds the two environments by themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda13=0
for a in "$@"; do
    case "$a" in
        --cuda13) cuda13=1 ;;
        *) echo "usage: scripts/install-test-tools.sh [--cuda13]" >&2; exit 2 ;;
    esac
done
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
need=()
command -v mpicc >/dev/null || need+=(openmpi-bin libopenmpi-dev)
# bindgen loads libclang.so or libclang-<version>.so (libclang-cpp, which LLVM's own packages
# bring, is another library).
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null \
    || compgen -G '/usr/lib/llvm-*/lib/libclang-[0-9]*.so*' >/dev/null \
    || need+=(libclang-dev)
command -v chromium >/dev/null || need+=(chromium)
# Slurm and munge: the cluster harness (scripts/cluster.sh test) runs a controller and one
# slurmd per host, with its own munge socket and files; the hosts' daemons listen in their
# own network namespaces, so a machine's own Slurm or munge (where the packages start one) is
# left alone, and neither disturbs the harness.
command -v slurmd >/dev/null && command -v slurmctld >/dev/null && command -v srun >/dev/null \
    && command -v munged >/dev/null || need+=(slurmd slurmctld slurm-client munge)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q >/dev/null
    $sudo apt-get install -y -q "${need[@]}" >/dev/null
fi
# shellcheck source=scripts/cuda-wheels.sh
. scripts/cuda-wheels.sh
wheels .venv-cuda "$CUDA12_WHEELS"
# h5py, safetensors and numpy: the script that writes --init's test files (a Keras HDF5 and a
# torchvision safetensors file of one small ResNet; nothing is downloaded but the wheels).
wheels .venv-init "h5py==3.16.0 safetensors==0.8.0 numpy==2.4.6"
if [ "$cuda13" = 1 ]; then
    wheels .venv-cuda13 "$CUDA13_WHEELS"
fi
echo "installed: ${need[*]:-no Debian package needed}; NVRTC wheels in .venv-cuda, h5py and safetensors in .venv-init$([ "$cuda13" = 1 ] && echo ", CUDA 13 wheels in .venv-cuda13")"
