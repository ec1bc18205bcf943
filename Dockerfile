# Training image: TensorFlow 2.21 on Python 3.10-3.13 (the base's python3). CPU by default;
# for NVIDIA GPUs build with
#   docker build --build-arg BASE=nvidia/cuda:12.5.1-cudnn-devel-ubuntu22.04 \
#                --build-arg DLRM_DEVICE=gpu -t dlrm-tf2:gpu .
# (the GPU flavour installs tensorflow[and-cuda], builds horovod with NCCL and the CUDA
# dot-interaction op; TensorFlow 2.21's CUDA wheels are 12.5+, Ubuntu 22.04's Python 3.10).
ARG BASE=python:3.11-bookworm
FROM ${BASE}
ARG DLRM_DEVICE=cpu
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
        g++ make cmake git openmpi-bin libopenmpi-dev default-jre-headless \
        python3 python3-venv python3-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /workspace/dlrm
# dependencies first, so code changes do not rebuild horovod
COPY requirements.txt ./
COPY tools/setup_env.sh tools/horovod-0.28.1-tf2.21.patch tools/
RUN DLRM_DEVICE=${DLRM_DEVICE} bash tools/setup_env.sh
COPY . .
RUN TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -m core.fused_ops --build
RUN if [ "$DLRM_DEVICE" = gpu ]; then .venv/bin/python -m pip install --no-build-isolation ./tensorflow-dot-based-interact; fi
ENV PATH=/workspace/dlrm/.venv/bin:$PATH
CMD ["python", "main.py", "--help"]
