# The CUDA pip wheels the tests use (sourced by .ci/run, scripts/install-test-tools.sh and
# scripts/test.sh): one list, one installer.
# NVRTC 12.4: its PTX (ISA 8.4) loads on every driver from R550 on.
CUDA12_WHEELS="nvidia-cuda-nvrtc-cu12==12.4.127 nvidia-cuda-runtime-cu12==12.4.127 nvidia-cuda-nvcc-cu12==12.4.131"
# CUDA 13's NVRTC and ptxas, and the libraries PyTorch 2.11 installs with CUDA 13 (cuBLAS/
# cuBLASLt 13.1, cuDNN 9.19, NCCL 2.28), and nvdisasm (the oldest nvdisasm wheel on PyPI).
CUDA13_WHEELS="nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cublas==13.1.0.3 nvidia-cudnn-cu13==9.19.0.56 nvidia-nccl-cu13==2.28.9 nvidia-cuda-nvdisasm==13.2.51"

# wheels VENV "LIST": a virtual environment at VENV with LIST installed (pip skips what is there).
wheels() {
    if [ ! -x "$1/bin/python" ]; then
        python3 -m venv "$1"
    fi
    # shellcheck disable=SC2086
    "$1/bin/pip" install --quiet --disable-pip-version-check $2
}

# nvidia_path VENV: where the wheels put the `nvidia` package.
nvidia_path() {
    "$1/bin/python" -c 'import nvidia; print(list(nvidia.__path__)[0])'
}
