"""kcp_dump: write kcp-dump version 2 files (docs/DUMP_FORMAT.md) for `kcp check`.

Two halves:
  * the file-writing half needs numpy and h5py only: ``write_dump(path, op, inputs, results, ...)``
    writes inputs, flags and result groups, bf16 in any of the three encodings kcp reads, narrowing
    float32 to bf16 with round-to-nearest-even (PyTorch's rule, never HDF5's), atomically (temp + rename).
  * the torch half captures one call of FLA's ``chunk_kda`` / ``chunk_gated_delta_rule``, directly
    (``KernelCapture``) or inside a Megatron-LM module (``install_megatron_capture``), and writes the
    inputs, flags, outputs and, after backward, the cotangents and the kernel's input gradients.

Tested by tests/tools/test_kcp_dump.py (numpy half, through the kcp executable).
"""
import os
import tempfile

import h5py
import numpy as np

FORMAT = "kcp-dump"
FORMAT_VERSION = 2
ENCODINGS = ("float32", "bf16_float", "bf16_bits")  # "float32" is the goldens' upcast form
OP_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "do", "dht")


# --- bfloat16 without torch ------------------------------------------------------------------------

def bf16_bits_from_float32(x):
    """Rounds float32 values to bfloat16 bit patterns, ties to even (torch's .to(torch.bfloat16))."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7F800000) == 0x7F800000
    nan &= (u & 0x007FFFFF) != 0
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    quiet = (u >> 16) | 0x0040
    return np.where(nan, quiet, rounded).astype(np.uint16)


def float32_from_bf16_bits(bits):
    """Widens bfloat16 bit patterns to float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_float_type():
    """The 2-byte HDF5 float type of bfloat16: IEEE f32 with sign 15, exponent 7..14, mantissa 0..6, bias 127."""
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)
    t.set_size(2)
    t.set_ebias(127)
    return t


def _bf16_bits(name, a):
    """Bit patterns of a tensor declared bfloat16: uint16 bits as given, float values only if exact."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return a
    f = np.asarray(a, dtype=np.float32)
    if not np.array_equal(f, a) or np.any(f.view(np.uint32) & 0xFFFF):
        raise ValueError(f"{name}: declared bfloat16 but holds values that are not bfloat16; round them first "
                         f"with bf16_bits_from_float32() (ties to even), never let HDF5 narrow")
    return (f.view(np.uint32) >> 16).astype(np.uint16)


# --- the file-writing half ------------------------------------------------------------------------

def _write_dataset(group, name, array, source, encoding):
    """One dataset with attributes dtype and encoding; bf16 in the chosen encoding."""
    if source == "bfloat16":
        bits = _bf16_bits(f"{group.name}/{name}", array)
        if encoding == "float32":
            ds = group.create_dataset(name, data=float32_from_bf16_bits(bits))
            enc = "ieee"
        elif encoding == "bf16_float":  # low-level write: memory type == file type, so HDF5 never converts
            t = bf16_float_type()
            space = h5py.h5s.create_simple(bits.shape) if bits.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
            dsid = h5py.h5d.create(group.id, name.encode(), t, space)
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(bits), mtype=t)
            ds, enc = h5py.Dataset(dsid), "bf16_float"
        elif encoding == "bf16_bits":
            ds, enc = group.create_dataset(name, data=bits), "bf16_bits"
        else:
            raise ValueError(f"bf16 encoding must be one of {ENCODINGS}, got {encoding!r}")
    else:
        a = np.asarray(array)
        if source in ("float64", "float32", "float16", "int32", "int64"):
            a = a.astype(np.dtype(source), copy=False)
        ds, enc = group.create_dataset(name, data=a), "ieee"
    ds.attrs["dtype"] = source
    ds.attrs["encoding"] = enc
    return ds


def _source_dtype(key, array, dtypes):
    """The producer's dtype of a tensor: dtypes[key] or dtypes[name], else the numpy dtype's name."""
    name = key.split("/")[-1]
    for k in (key, name):
        if dtypes and k in dtypes:
            return str(dtypes[k]).replace("torch.", "")
    return "bfloat16" if np.asarray(array).dtype == np.uint16 else np.asarray(array).dtype.name


def _attr_value(v):
    """Attribute values as kcp reads them: bool stays bool (h5py enum), None becomes NaN."""
    if v is None:
        return float("nan")
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return v


def write_dump(path, op, inputs, results=None, attrs=None, dtypes=None, bf16_encoding="bf16_float",
               group_attrs=None):
    """Writes a kcp-dump v2 file atomically.

    op:       "gdn", "kda", "gla" or "conv1d".
    inputs:   name -> array for /inputs (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens,
              do, dht; for conv1d x, weight, bias, cu_seqlens, dy).
    results:  group -> name -> array (o, final_state, dq, ...), e.g. {"fla_chunk": {...}}.
    attrs:    root attributes: flags (bool), scale, chunk_size, lower_bound (None -> NaN), placement...
    dtypes:   name or "group/name" -> producer dtype ("bfloat16", "float32", ...); bf16 tensors are
              float32 arrays holding bf16 values or uint16 bit patterns.
    """
    if op not in ("gdn", "kda", "gla", "conv1d"):
        raise ValueError(f"unknown op {op!r} (expected gdn, kda, gla or conv1d)")
    if bf16_encoding not in ENCODINGS:
        raise ValueError(f"bf16_encoding must be one of {ENCODINGS}")
    root = {"format": FORMAT, "format_version": FORMAT_VERSION, "op": op, "layout": "BTHD"}
    first = "x" if op == "conv1d" else "q"
    if first in inputs:
        root["input_dtype"] = _source_dtype(f"inputs/{first}", inputs[first], dtypes)
    root.update(attrs or {})
    root["format"], root["format_version"] = FORMAT, FORMAT_VERSION
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in root.items():
                f.attrs[k] = _attr_value(v)
            groups = {"inputs": inputs}
            groups.update(results or {})
            for gname, tensors in groups.items():
                g = f.create_group(gname)
                for k, v in ((group_attrs or {}).get(gname) or {}).items():
                    g.attrs[k] = _attr_value(v)
                for name, array in tensors.items():
                    if array is None:
                        continue
                    src = _source_dtype(f"{gname}/{name}", array, dtypes)
                    if name.startswith("cu_seqlens"):
                        src = "int64"
                    _write_dataset(g, name, array, src, bf16_encoding)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# --- the torch half -------------------------------------------------------------------------------

def _torch():
    import torch  # noqa: imported lazily so that the numpy half needs no torch
    return torch


def _to_numpy(t):
    """(array, dtype label): bf16 as exact uint16 bits, other floats as they are, ints as int64."""
    torch = _torch()
    label = str(t.dtype).replace("torch.", "")
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).copy(), label
    if t.is_floating_point():
        return t.numpy().copy(), label
    return t.to(torch.int64).numpy().copy(), "int64"


def _tap_function():
    torch = _torch()

    class Tap(torch.autograd.Function):
        """Identity whose backward records the incoming gradient under `name`."""

        @staticmethod
        def forward(ctx, x, name, store):
            ctx.name, ctx.store = name, store
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            ctx.store(ctx.name, grad)
            return grad, None, None

    return Tap


class KernelCapture:
    """Wraps an FLA kernel (chunk_kda or chunk_gated_delta_rule) and dumps one of its calls.

        from fla.ops.kda import chunk_kda
        kda = KernelCapture(chunk_kda, "run/kda_L3.h5")
        o, ht = kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                    output_final_state=True)
        (o * do).sum().backward()   # the file is written once every gradient has arrived
        kda.flush()                 # or now: forward-only / partial captures

    Every input is tapped by an identity autograd function, so the recorded gradient of q is the
    kernel's own dL/dq even when q is used elsewhere too. `select` picks the call: "first_with_grad"
    skips calls under no_grad (the first forward of selective recompute), or an int call index.
    """

    def __init__(self, kernel, path, op=None, select="first_with_grad", group="fla_chunk", attrs=None,
                 bf16_encoding="bf16_float"):
        import inspect
        self.kernel, self.path, self.group = kernel, path, group
        name = getattr(kernel, "__name__", "")
        self.op = op or ("kda" if "kda" in name else "gdn")
        self.signature = inspect.signature(kernel)
        self.select, self.calls, self.written = select, 0, False
        self.attrs, self.bf16_encoding = dict(attrs or {}), bf16_encoding
        self.inputs, self.results, self.dtypes, self.root = {}, {}, {}, {}
        self.pending = set()

    def _selected(self, args):
        torch = _torch()
        index = self.calls
        self.calls += 1
        if self.written or self.inputs:
            return False
        if self.select == "first_with_grad":
            return torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args)
        return index == self.select

    def __call__(self, *args, **kwargs):
        bound = self.signature.bind(*args, **kwargs)
        tensors = [v for v in bound.arguments.values() if hasattr(v, "requires_grad")]
        if not self._selected(tensors):
            return self.kernel(*args, **kwargs)
        self._record_call(bound.arguments)
        Tap = _tap_function()
        for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"):
            t = bound.arguments.get(name)
            if t is not None and t.requires_grad:
                self.pending.add("d" + name)
                bound.arguments[name] = Tap.apply(t, "d" + name, self._store)
        out = self.kernel(*bound.args, **bound.kwargs)
        o, ht = (out[0], out[1]) if isinstance(out, tuple) else (out, None)
        self._keep(self.results, "o", o)
        if ht is not None:
            self._keep(self.results, "final_state", ht)
        if not self.pending:
            self.flush()
            return out
        o = Tap.apply(o, "do", self._store)
        if ht is not None:
            ht = Tap.apply(ht, "dht", self._store)
        return (o, ht) + tuple(out[2:]) if isinstance(out, tuple) else o

    def _keep(self, where, name, t):
        where[name], self.dtypes[("inputs/" if where is self.inputs else self.group + "/") + name] = _to_numpy(t)

    def _record_call(self, a):
        for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens"):
            if a.get(name) is not None:
                self._keep(self.inputs, name, a[name])
        q, v = a["q"], a["v"]
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        cu = a.get("cu_seqlens")
        scale = a.get("scale")
        r = self.root
        r.update(kernel=getattr(self.kernel, "__name__", "?"), capture_point="kernel", source_framework="fla",
                 B=B, T=T, H=H, HV=HV, K=K, V=V, N=(len(cu) - 1 if cu is not None else B),
                 scale=float(scale) if scale is not None else K ** -0.5, chunk_size=int(a.get("chunk_size") or 64),
                 lower_bound=a.get("lower_bound"), state_layout="VK" if a.get("state_v_first") else "KV")
        for flag in ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                     "allow_neg_eigval", "safe_gate", "output_final_state"):
            r[flag] = bool(a.get(flag) or False)
        ctx = a.get("cp_context")
        if ctx is not None:  # FLA's chunkwise CP context (DUMPS.md section 1.5)
            for field in ("pre_num_ranks", "post_num_ranks", "is_first_rank", "is_last_rank", "pre_num_conv_tokens"):
                if hasattr(ctx, field):
                    r["cp_" + field] = _plain(getattr(ctx, field))
            if getattr(ctx, "cu_seqlens", None) is not None:
                self._keep(self.inputs, "cu_seqlens_local", ctx.cu_seqlens)
            r["cp_mode"] = "chunkwise"
        try:
            import fla
            r["fla_version"] = getattr(fla, "__version__", "?")
        except ImportError:
            pass
        r["torch_version"] = _torch().__version__

    def _store(self, name, grad):
        if grad is None:
            return
        if name in ("do", "dht"):
            self._keep(self.inputs, name, grad)
        else:
            self._keep(self.results, name, grad)
            self.pending.discard(name)
        if not self.pending and "do" in self.inputs:
            self.flush()

    def flush(self):
        """Writes what was captured (once)."""
        if self.written or not self.inputs:
            return
        attrs = dict(self.root)
        attrs.update(self.attrs)
        write_dump(self.path, self.op, self.inputs, {self.group: self.results}, attrs, self.dtypes,
                   self.bf16_encoding)
        self.written = True


def _plain(x):
    if hasattr(x, "item"):
        x = x.item()
    return bool(x) if isinstance(x, bool) else x


def megatron_placement():
    """TP/CP ranks from Megatron's parallel_state when it is initialised, else a single rank."""
    try:
        from megatron.core import parallel_state as ps
        return dict(tp_size=ps.get_tensor_model_parallel_world_size(), tp_rank=ps.get_tensor_model_parallel_rank(),
                    cp_size=ps.get_context_parallel_world_size(), cp_rank=ps.get_context_parallel_rank(),
                    pp_rank=ps.get_pipeline_model_parallel_rank(), dp_rank=ps.get_data_parallel_rank())
    except Exception:  # not Megatron, or parallel_state not initialised
        return dict(tp_size=1, tp_rank=0, cp_size=1, cp_rank=0)


def install_megatron_capture(module, folder, iteration=0, microbatch=0, attrs=None, **capture_kwargs):
    """Replaces module.gated_delta_rule (a Megatron GDN/KDA layer) with a KernelCapture writing
    <folder>/<op>_L<layer>_it<iteration>_mb<microbatch>_tp<r>of<n>_cp<r>of<n>.h5; returns the capture.
    Add token_offset / head_offset / cp_mode to `attrs` for CP runs (DUMPS.md section 6)."""
    kernel = module.gated_delta_rule
    op = "kda" if "kda" in getattr(kernel, "__name__", "") else "gdn"
    place = megatron_placement()
    layer = getattr(module, "layer_number", -1)
    name = (f"{op}_L{layer}_it{iteration}_mb{microbatch}_tp{place['tp_rank']}of{place['tp_size']}"
            f"_cp{place['cp_rank']}of{place['cp_size']}.h5")
    meta = dict(place, source_framework="megatron-lm", layer_number=layer, iteration=iteration,
                microbatch=microbatch, module_name=type(module).__name__, qk_l2norm_applied=True,
                gqa_expanded=op == "gdn")
    meta.update(attrs or {})
    capture = KernelCapture(kernel, os.path.join(folder, name), op=op, group="megatron", attrs=meta,
                            **capture_kwargs)
    module.gated_delta_rule = capture
    return capture

