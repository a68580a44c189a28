"""kcp_dump.megatron: capture the kernel call of a Megatron-LM GDN / KDA layer (docs/DUMP_FORMAT.md section 6).

install_megatron_capture(module, folder, ...) replaces the module attribute `gated_delta_rule` (set in
`_setup_variant_attrs`, always called with keyword arguments) with a KernelCapture writing group
`megatron` to <folder>/<op>_L<layer>_it<iter>_mb<micro>_tp<r>of<n>_cp<r>of<n>.h5, with TP/CP ranks
from megatron.core.parallel_state. megatron_placement() raises when the ranks cannot be known (a
distributed run whose parallel_state is not initialised, or a query that fails): a file named rank 0
of 1 on every rank would silently overwrite the others.
Covered by tests/tools/test_kcp_capture.py (a stand-in Megatron module).
"""
import os

from . import kernels
from .capture import KernelCapture


def _distributed():
    """(initialised, world_size, rank) of torch.distributed; (False, 1, 0) without it."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return True, dist.get_world_size(), dist.get_rank()
    except ImportError:
        pass
    return False, 1, 0


def megatron_placement():
    """TP/CP/PP/DP ranks from Megatron's parallel_state. A single process without torch.distributed
    and without Megatron's model parallelism is one rank; anything that cannot be known is an error."""
    dist_on, world, rank = _distributed()
    try:
        from megatron.core import parallel_state as ps
    except ImportError as e:
        if world > 1:
            raise RuntimeError(f"kcp_dump: megatron_placement: torch.distributed runs {world} ranks but "
                               f"megatron.core.parallel_state cannot be imported ({e}); pass the placement "
                               f"(tp_rank, tp_size, cp_rank, cp_size) in attrs=") from e
        return dict(tp_size=1, tp_rank=0, cp_size=1, cp_rank=0, global_rank=rank)
    initialised = getattr(ps, "model_parallel_is_initialized", lambda: True)()
    if not initialised:
        if world > 1:
            raise RuntimeError(f"kcp_dump: megatron_placement: {world} ranks but Megatron's parallel_state "
                               f"is not initialised (call install_megatron_capture after initialize_model_parallel)")
        return dict(tp_size=1, tp_rank=0, cp_size=1, cp_rank=0, global_rank=rank)
    try:
        return dict(tp_size=ps.get_tensor_model_parallel_world_size(), tp_rank=ps.get_tensor_model_parallel_rank(),
                    cp_size=ps.get_context_parallel_world_size(), cp_rank=ps.get_context_parallel_rank(),
                    pp_rank=ps.get_pipeline_model_parallel_rank(), dp_rank=ps.get_data_parallel_rank(),
                    global_rank=rank)
    except Exception as e:
        raise RuntimeError(f"kcp_dump: megatron_placement: Megatron's parallel_state failed: {e!r}") from e


def capture_file_name(op, layer, iteration, microbatch, place):
    return (f"{op}_L{layer}_it{iteration}_mb{microbatch}_tp{place['tp_rank']}of{place['tp_size']}"
            f"_cp{place['cp_rank']}of{place['cp_size']}.h5")


def install_megatron_capture(module, folder, iteration=0, microbatch=0, attrs=None, placement=None,
                             kernel_name=None, **capture_kwargs):
    """Replaces module.gated_delta_rule with a KernelCapture (group "megatron") and returns it.
    `placement` overrides megatron_placement(); add token_offset / head_offset / cp_mode to `attrs`
    for CP runs (DUMP_FORMAT.md section 5)."""
    if not hasattr(module, "gated_delta_rule"):
        raise AttributeError(f"kcp_dump: {type(module).__name__} has no attribute gated_delta_rule "
                             f"(expected a Megatron GatedDeltaNet / KimiDeltaAttention module)")
    kernel = module.gated_delta_rule
    if isinstance(kernel, KernelCapture):
        raise RuntimeError(f"kcp_dump: {type(module).__name__}.gated_delta_rule is already captured ({kernel.path})")
    spec = kernels.spec_for(kernel, kernel_name)
    place = dict(placement) if placement is not None else megatron_placement()
    layer = getattr(module, "layer_number", -1)
    path = os.path.join(folder, capture_file_name(spec.op, layer, iteration, microbatch, place))
    meta = dict(place, source_framework="megatron-lm", layer_number=layer, iteration=iteration,
                microbatch=microbatch, module_name=type(module).__name__)
    meta.update(attrs or {})
    capture = KernelCapture(kernel, path, group="megatron", attrs=meta, kernel_name=spec.name, **capture_kwargs)
    module.gated_delta_rule = capture
    return capture
