# Sourced by the GPU scripts that start ranks (gpu.sh, gpu_cp_ab.sh), from the repository root: NCCL
# for cp/comm_nccl.cpp (loaded at run time: the system's, else the one PyTorch ships), OpenMPI as root,
# NVLink multicast off (NCCL_NVLS_ENABLE=0), and `mpi`, the mpirun prefix that passes them to every
# rank (its last word is -np: append the rank count and the command). `gpus`: this machine's count.
if [ -z "${KCP_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$nccl_dir" ] && [ -f "$nccl_dir/libnccl.so.2" ] && export KCP_NCCL_LIBRARY="$nccl_dir/libnccl.so.2"
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export KCP_CUDA_KEEP=${KCP_CUDA_KEEP:-0}  # exported to every rank; callers set 1 per command
mpi=(mpirun --oversubscribe --bind-to none -x KCP_NCCL_LIBRARY -x NCCL_NVLS_ENABLE -x NCCL_DEBUG -x LD_LIBRARY_PATH -x KCP_CUDA_KEEP -np)
