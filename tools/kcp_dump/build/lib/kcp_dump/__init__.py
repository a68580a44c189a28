"""kcp_dump: write kcp-dump files (docs/DUMP_FORMAT.md) and capture FLA kernel calls for `kcp check`.

    from kcp_dump import KernelCapture                      # needs torch
    kda = KernelCapture(chunk_kda, "dumps/kda.h5")
    o, ht = kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, output_final_state=True)

writer (numpy + h5py), kernels (FLA's signatures), capture (KernelCapture), megatron
(install_megatron_capture). Tested by tests/tools/test_kcp_dump.py and test_kcp_capture.py.
"""
from .writer import (ENCODINGS, FORMAT, FORMAT_VERSION, attr_value, bf16_bits_from_float32, bf16_float_type,
                     float32_from_bf16_bits, write_dump)
from .kernels import SPECS, spec_for
from .capture import KernelCapture, to_numpy
from .megatron import install_megatron_capture, megatron_placement

__version__ = "0.2.0"
__all__ = ["write_dump", "bf16_bits_from_float32", "float32_from_bf16_bits", "bf16_float_type", "attr_value",
           "ENCODINGS", "FORMAT", "FORMAT_VERSION", "SPECS", "spec_for", "KernelCapture", "to_numpy",
           "install_megatron_capture", "megatron_placement", "__version__"]
