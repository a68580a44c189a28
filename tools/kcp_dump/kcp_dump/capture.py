"""kcp_dump.capture: KernelCapture wraps FLA's chunk_kda / chunk_gated_delta_rule / chunk_gla and dumps
one call: every argument (positional, keyword and **kwargs, kernels.py), the flags with FLA's defaults
filled in, the outputs and, after backward, the cotangents do / dht and the kernel's own input
gradients dq .. dinitial_state, dA_log, ddt_bias.

Each input and output passes through an identity autograd function (Tap) whose backward records the
gradient arriving there, so dq is the kernel's dL/dq even when q is used elsewhere too. The file is
written when every expected gradient has arrived; `flush()` (or the end of the process) writes what
there is and reports each gradient that never arrived. Arguments the tables do not know are recorded
(attribute `unknown_args`, scalars as `arg_<name>`, tensors under /debug) and reported on stderr.
Bad input (a tensor on another device than q, a non-float tensor, mixed q/k/v dtypes, an unsupported
kernel) is one error at capture time naming the argument.
Covered by tests/tools/test_kcp_capture.py (stand-in kernels with FLA's signatures, through kcp check).
"""
import atexit
import sys
import weakref

from . import kernels
from .writer import write_dump

_TENSOR_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")
_FLOAT_DTYPES = ("bfloat16", "float16", "float32", "float64")
_LIVE = []  # weak references to every capture, flushed at exit


def _torch():
    import torch  # imported lazily: the writer half needs no torch
    return torch


def _warn(msg):
    print(f"kcp_dump: {msg}", file=sys.stderr, flush=True)


def _is_tensor(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "requires_grad") and hasattr(x, "dtype")


def _dtype_label(t):
    return str(t.dtype).replace("torch.", "")


def to_numpy(t):
    """(array, dtype label): bf16 as exact uint16 bits, other floats as they are, ints as int64."""
    import numpy as np
    torch = _torch()
    label = _dtype_label(t)
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).copy(), label
    if t.is_floating_point():
        return t.numpy().copy(), label
    return t.to(torch.int64).numpy().copy(), "int64"


def _tap_class():
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


def _flush_all_at_exit():
    for ref in list(_LIVE):
        cap = ref()
        if cap is not None and cap.inputs and not cap.written:
            try:
                cap.flush(reason="the process exits")
            except Exception as e:  # noqa: reported, the exit goes on
                _warn(f"{cap.path}: could not be written at exit: {e}")


atexit.register(_flush_all_at_exit)


class KernelCapture:
    """Wraps an FLA kernel and dumps one of its calls:

        kda = KernelCapture(chunk_kda, "run/kda_L3.h5")
        o, ht = kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                    output_final_state=True)
        ((o * do).sum() + (ht * dht).sum()).backward()   # written once every gradient arrived

    `select`: "first_with_grad" skips calls under no_grad (the first forward of selective recompute),
    or an int call index. `kernel_name` names the kernel when its function name is not FLA's.
    `cp_global_cu_seqlens`: with a `cp_context`, the global cu_seqlens before FLA's split (else the
    call's own cu_seqlens argument, which FLA ignores under CP); stored with scope = "global" next to
    token_offset = cp_rank * T_local, so that `kcp assemble` can rebuild the global call.
    """

    def __init__(self, kernel, path, op=None, select="first_with_grad", group="fla_chunk", attrs=None,
                 bf16_encoding="bf16_float", kernel_name=None, cp_global_cu_seqlens=None):
        self.spec = kernels.spec_for(kernel, kernel_name, op)
        self.cp_global_cu = cp_global_cu_seqlens  # chunkwise CP: the cu_seqlens before the split (assemble)
        self.kernel, self.path, self.group, self.op = kernel, str(path), group, self.spec.op
        self.select, self.calls, self.written = select, 0, False
        self.attrs, self.bf16_encoding = dict(attrs or {}), bf16_encoding
        self.inputs, self.results, self.debug, self.dtypes, self.root = {}, {}, {}, {}, {}
        self.pending, self.expected, self.dataset_attrs = set(), set(), {}
        self.__name__ = self.spec.name  # so that a capture can itself be recognised (Megatron re-wrap)
        _LIVE.append(weakref.ref(self))

    # --- the call -------------------------------------------------------------------------------
    def _selected(self, call):
        torch = _torch()
        index = self.calls
        self.calls += 1
        if self.written or self.inputs:
            return False
        if self.select == "first_with_grad":
            return torch.is_grad_enabled() and any(
                _is_tensor(v) and v.requires_grad for v in call.values.values())
        return index == self.select

    def __call__(self, *args, **kwargs):
        call = self.spec.bind(args, kwargs)
        if not self._selected(call):
            return self.kernel(*args, **kwargs)
        try:
            self._validate(call)
            self._record(call)
        except BaseException:  # refused: nothing half-recorded is left for the exit-time flush
            self._reset()
            raise
        Tap = _tap_class()
        args, kwargs = list(args), dict(kwargs)
        for name in self._gradient_inputs(call):
            t = call.values[name]
            self.pending.add("d" + name)
            self.expected.add("d" + name)
            call.replace(name, Tap.apply(t, "d" + name, self._store), args, kwargs)
        try:
            out = self.kernel(*args, **kwargs)
        except BaseException:  # the kernel refused the call: nothing to dump, the next call may be captured
            self._reset()
            raise
        o, ht = (out[0], out[1]) if isinstance(out, (tuple, list)) else (out, None)
        self._keep(self.results, "o", o)
        if ht is not None:
            self._keep(self.results, "final_state", ht)
        if not self.pending or not (o.requires_grad or (ht is not None and ht.requires_grad)):
            self.flush()
            return out
        o = Tap.apply(o, "do", self._store)
        if ht is not None:
            ht = Tap.apply(ht, "dht", self._store)
        return (o, ht) + tuple(out[2:]) if isinstance(out, (tuple, list)) else o

    def _reset(self):
        self.inputs, self.results, self.debug, self.dtypes, self.root = {}, {}, {}, {}, {}
        self.pending, self.expected, self.dataset_attrs = set(), set(), {}

    def _gradient_inputs(self, call):
        names = [n for n in _TENSOR_INPUTS if n in call.values and _is_tensor(call.values[n])]
        if not self._gate_params_used(call):
            names = [n for n in names if n not in ("A_log", "dt_bias")]
        return [n for n in names if call.values[n].requires_grad]

    def _gate_params_used(self, call):
        """FLA reads A_log / dt_bias only with use_gate_in_kernel (kda and gdn)."""
        return self.op != "gla" and bool(call.get("use_gate_in_kernel", False))

    # --- checks at capture time ---------------------------------------------------------------------
    def _validate(self, call):
        name = self.spec.name
        q = call.values["q"]
        required = ("q", "k", "v", "g") + (("beta",) if self.op != "gla" else ())
        for n in required:
            if not _is_tensor(call.values[n]):
                raise TypeError(f"{name}: argument {n}: expected a torch tensor, got {type(call.values[n]).__name__}")
        for n in _TENSOR_INPUTS + ("cu_seqlens",):
            t = call.values.get(n)
            if t is None:
                continue
            if not _is_tensor(t):
                raise TypeError(f"{name}: argument {n}: expected a torch tensor or None, got {type(t).__name__}")
            if t.device != q.device:
                raise ValueError(f"{name}: argument {n} is on {t.device}, q on {q.device} (every tensor the kernel "
                                 f"reads must be on the kernel's device)")
            if n == "cu_seqlens":
                if t.is_floating_point() or t.dim() != 1:
                    raise ValueError(f"{name}: argument cu_seqlens: expected a 1-D integer tensor, got "
                                     f"{_dtype_label(t)} of shape {list(t.shape)}")
            elif _dtype_label(t) not in _FLOAT_DTYPES:
                raise ValueError(f"{name}: argument {n}: dtype {_dtype_label(t)} is not a float type kcp reads "
                                 f"({', '.join(_FLOAT_DTYPES)})")
        for n in ("q", "k", "v"):
            if call.values[n].dim() != 4:
                raise ValueError(f"{name}: argument {n}: expected [B, T, heads, dim], got shape {list(call.values[n].shape)}")
        for n in ("k", "v"):
            if call.values[n].dtype != q.dtype:
                raise ValueError(f"{name}: argument {n} is {_dtype_label(call.values[n])}, q is {_dtype_label(q)}")
        cpu = call.values.get("cu_seqlens_cpu")
        cu = call.values.get("cu_seqlens")
        if _is_tensor(cpu) and _is_tensor(cu) and cpu.tolist() != cu.tolist():
            raise ValueError(f"{name}: argument cu_seqlens_cpu {cpu.tolist()} differs from cu_seqlens {cu.tolist()}")

    # --- recording ------------------------------------------------------------------------------
    def _keep(self, where, name, t):
        prefix = {id(self.inputs): "inputs/", id(self.debug): "debug/"}.get(id(where), self.group + "/")
        where[name], self.dtypes[prefix + name] = to_numpy(t)

    def _record(self, call):
        v = call.values
        names = ["q", "k", "v", "g", "initial_state", "cu_seqlens"] + (["beta"] if self.op != "gla" else [])
        if self._gate_params_used(call):
            names += ["A_log", "dt_bias"]
        for n in names:
            if v.get(n) is not None:
                self._keep(self.inputs, n, v[n])
        r = self.root
        q, vv = v["q"], v["v"]
        B, T, H, K = q.shape
        HV, V = vv.shape[2], vv.shape[3]
        cu = v.get("cu_seqlens")
        r.update(kernel=self.spec.name, capture_point="kernel", source_framework="fla", B=B, T=T, H=H, HV=HV,
                 K=K, V=V, N=(len(cu) - 1 if cu is not None else B), device=str(q.device),
                 scale=float(v["scale"]) if v.get("scale") is not None else K ** -0.5,
                 state_layout="VK" if v.get("state_v_first") else "KV",
                 output_final_state=bool(v.get("output_final_state")))
        if self.op != "gla":  # names the kernel does not read (gdn's safe_gate, lower_bound) keep their defaults
            read = {n: (None if n in self.spec.ignored else v.get(n)) for n in v}
            r.update(chunk_size=int(read.get("chunk_size") or 64), lower_bound=read.get("lower_bound"))
            for flag in ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                         "allow_neg_eigval", "safe_gate", "disable_recompute"):
                r[flag] = bool(read.get(flag) or False)
        for flag in ("return_intermediate_states",):
            if call.given(flag):
                r[flag] = bool(v.get(flag))
        for n in ("cu_seqlens_cpu", "chunk_indices"):
            if v.get(n) is not None:
                r[n + "_given"] = True
        self._record_ignored(call)
        self._record_cp_context(v.get("cp_context"), v.get("cu_seqlens"), T)
        self._record_unknown(call)
        if call.aliased:
            r["aliased_args"] = ", ".join(f"{k} -> {n}" for k, n in call.aliased.items())
        try:
            import fla
            r["fla_version"] = str(getattr(fla, "__version__", "?"))
        except ImportError:
            pass
        r["torch_version"] = str(_torch().__version__)  # a str subclass: h5py cannot store it as is

    def _record_ignored(self, call):
        ignored = [n for n in self.spec.ignored if call.given(n)]
        if not self._gate_params_used(call):
            ignored += [n for n in ("A_log", "dt_bias") if call.values.get(n) is not None]
        if ignored:
            self.root["ignored_args"] = ", ".join(ignored)
            _warn(f"{self.path}: {self.spec.name} does not read {', '.join(ignored)} in this call "
                  f"(recorded as ignored_args; kcp leaves them out as the kernel does)")

    def _record_cp_context(self, ctx, cu_arg, T_local):
        """FLA's chunkwise CP context (docs/ALGORITHMS.md 5.1, docs/DUMP_FORMAT.md section 5): its fields as cp_* attributes; its
        rank-local cu_seqlens (which FLA uses instead of the argument) as /inputs/cu_seqlens_local; the
        global cu_seqlens (scope "global") and token_offset when known (_record_cp_global)."""
        if ctx is None:
            return
        r = self.root
        r["cp_mode"] = "chunkwise"
        for field in ("pre_num_ranks", "post_num_ranks", "is_first_rank", "is_last_rank", "pre_num_conv_tokens",
                      "conv1d_kernel_size"):
            value = getattr(ctx, field, None)
            if value is not None:
                r["cp_" + field] = value.item() if hasattr(value, "item") else value
        if getattr(ctx, "cu_seqlens", None) is not None:
            self._keep(self.inputs, "cu_seqlens_local", ctx.cu_seqlens)
            r["N"] = len(ctx.cu_seqlens) - 1
        group = getattr(ctx, "group", None)
        if group is not None:
            import torch.distributed as dist
            r["cp_size"], r["cp_rank"] = dist.get_world_size(group), dist.get_rank(group)
        self.inputs.pop("cu_seqlens", None)  # FLA ignores the argument under CP; only a checked global one is kept
        glob = self.cp_global_cu if self.cp_global_cu is not None else cu_arg
        if glob is None:
            _warn(f"{self.path}: chunkwise CP call without the global cu_seqlens (cp_global_cu_seqlens=): "
                  f"this rank's file cannot be assembled with the others")
            return
        self._record_cp_global(ctx, [int(x) for x in glob.tolist()] if _is_tensor(glob) else [int(x) for x in glob],
                               T_local)

    def _record_cp_global(self, ctx, glob, T_local):
        """token_offset = cp_rank * T_local (FLA's equal split); the global cu_seqlens must end at
        cp_size * T_local and give this rank's local cu_seqlens as FLA derives it."""
        size = int(self.attrs.get("cp_size", self.root.get("cp_size", 1)))
        rank = int(self.attrs.get("cp_rank", self.root.get("cp_rank", 0)))
        where = f"{self.spec.name}: cp_global_cu_seqlens {glob[:6]}{'...' if len(glob) > 6 else ''}"
        if not glob or glob[0] != 0 or glob[-1] != size * T_local:
            raise ValueError(f"{where}: must run from 0 to cp_size * T_local = {size} * {T_local} (FLA splits the "
                             f"packed tokens equally over the ranks)")
        lo, hi = rank * T_local, (rank + 1) * T_local
        local = []
        for c in glob:
            x = min(max(c, lo), hi) - lo
            if not local or local[-1] != x:
                local.append(x)
        ctx_local = [int(x) for x in ctx.cu_seqlens.tolist()] if getattr(ctx, "cu_seqlens", None) is not None else None
        if ctx_local is not None and ctx_local != local:
            raise ValueError(f"{where}: gives rank {rank}'s local cu_seqlens {local}, but cp_context has {ctx_local}")
        import numpy as np
        self.inputs["cu_seqlens"], self.dtypes["inputs/cu_seqlens"] = np.asarray(glob, dtype=np.int64), "int64"
        self.dataset_attrs["inputs/cu_seqlens"] = {"scope": "global"}
        self.root.update(token_offset=lo, cp_partition="contiguous", cp_size=size, cp_rank=rank)

    def _record_unknown(self, call):
        if not call.unknown:
            return
        from .writer import attr_value
        for key, value in call.unknown.items():
            if _is_tensor(value):
                self._keep(self.debug, "arg_" + key, value)
            else:
                try:
                    self.root["arg_" + key] = attr_value(key, value)
                except TypeError:
                    self.root["arg_" + key] = repr(value)
        self.root["unknown_args"] = ", ".join(call.unknown)
        _warn(f"{self.path}: {self.spec.name} got argument(s) kcp_dump does not know: {', '.join(call.unknown)}; "
              f"recorded (attributes arg_<name>, tensors under /debug) but not used by kcp check")

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

    def add_debug(self, name, tensor):
        """Stores `tensor` as /debug/<name> of the captured call (e.g. FLA's CP transitions); an error
        once the file is written."""
        if self.written:
            raise RuntimeError(f"{self.path}: already written; add_debug('{name}') must come before the backward ends")
        self._keep(self.debug, name, tensor)

    def missing(self):
        """Gradients expected (their input requires grad) that have not arrived, and do if absent."""
        miss = sorted(self.pending)
        if self.expected and "do" not in self.inputs:
            miss.insert(0, "do")
        return miss

    def flush(self, reason="flush() was called"):
        """Writes what was captured (once); reports every gradient that never arrived."""
        if self.written or not self.inputs:
            return
        attrs = dict(self.root)
        attrs.update(self.attrs)
        miss = self.missing()
        if miss:
            attrs["missing_gradients"] = ", ".join(miss)
            _warn(f"{self.path}: {reason} before {', '.join(miss)} arrived; written without them "
                  f"(attribute missing_gradients). Run backward before the capture is flushed.")
        results = {self.group: self.results}
        if self.debug:
            results["debug"] = self.debug
        write_dump(self.path, self.op, self.inputs, results, attrs, self.dtypes, self.bf16_encoding,
                   dataset_attrs=self.dataset_attrs)
        self.written = True
