"""kcp_dump.kernels: the call signatures of the FLA kernels kcp judges, as tables, and the binding of
one call to them (positional, keyword and **kwargs routes, deprecated aliases, unknown arguments).

FLA 0.5.2 (bc3b101), fla/ops/{kda,gated_delta_rule,gla}/chunk.py:
  chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
            use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
            disable_recompute, return_intermediate_states, state_v_first, cu_seqlens, cu_seqlens_cpu,
            cp_context, **kwargs: A_log, dt_bias, chunk_size, transpose_state_layout (old name))
  chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
            use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
            cu_seqlens, cu_seqlens_cpu, chunk_indices, cp_context,
            **kwargs: use_gate_in_kernel, A_log, dt_bias, chunk_size, transpose_state_layout)
  chunk_gla(q, k, v, g, scale, initial_state, output_final_state, state_v_first, cu_seqlens, cu_seqlens_cpu)
Every name here is a keyword FLA reads; a name the table does not know is returned in Call.unknown
(recorded and reported by the capture, never dropped). Written from FLA's documented signatures, no
FLA code. Covered by tests/tools/test_kcp_capture.py (a stand-in kernel with exactly these signatures).
"""
import functools

_NO = object()  # "no default": a required argument

_KDA_PARAMS = (("q", _NO), ("k", _NO), ("v", _NO), ("g", _NO), ("beta", _NO), ("scale", None),
               ("initial_state", None), ("output_final_state", False), ("use_qk_l2norm_in_kernel", False),
               ("use_gate_in_kernel", False), ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False),
               ("safe_gate", False), ("lower_bound", None), ("disable_recompute", False),
               ("return_intermediate_states", False), ("state_v_first", False), ("cu_seqlens", None),
               ("cu_seqlens_cpu", None), ("cp_context", None))
_GDN_PARAMS = (("q", _NO), ("k", _NO), ("v", _NO), ("g", _NO), ("beta", _NO), ("scale", None),
               ("initial_state", None), ("output_final_state", False), ("use_qk_l2norm_in_kernel", False),
               ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False), ("state_v_first", False),
               ("cu_seqlens", None), ("cu_seqlens_cpu", None), ("chunk_indices", None), ("cp_context", None))
_GLA_PARAMS = (("q", _NO), ("k", _NO), ("v", _NO), ("g", _NO), ("scale", None), ("initial_state", None),
               ("output_final_state", False), ("state_v_first", False), ("cu_seqlens", None),
               ("cu_seqlens_cpu", None))


class KernelSpec:
    """One kernel's signature: named parameters in order (name, default), the names it reads from
    **kwargs (with defaults), deprecated aliases, names FLA accepts through **kwargs but this kernel
    does not read (`ignored`, recorded with a warning), and names FLA refuses (`refused`)."""

    def __init__(self, name, op, params, routes=(), aliases=None, ignored=(), refused=None, chunk_sizes=(64,)):
        self.name, self.op, self.params = name, op, tuple(params)
        self.routes = dict(routes)
        self.aliases = dict(aliases or {})
        self.ignored, self.refused = tuple(ignored), dict(refused or {})
        self.chunk_sizes = chunk_sizes
        self.names = [n for n, _ in self.params]

    def defaults(self):
        d = {n: (None if v is _NO else v) for n, v in self.params}
        d.update(self.routes)
        return d

    def bind(self, args, kwargs):
        """Call(values, where, given, unknown, aliased): values has every known name (defaults filled in),
        where[name] = ("pos", i) or ("kw", key) for the arguments actually passed."""
        if len(args) > len(self.params):
            raise TypeError(f"{self.name}: takes at most {len(self.params)} positional arguments, got {len(args)}")
        values, where, unknown, aliased = self.defaults(), {}, {}, {}
        for i, a in enumerate(args):
            values[self.names[i]], where[self.names[i]] = a, ("pos", i)
        for key, a in kwargs.items():
            if key in self.refused:
                raise TypeError(f"{self.name}: argument {key}: {self.refused[key]}")
            name = self.aliases.get(key, key)
            if name != key:  # FLA: the old name overrides a false new one, and is an error next to a true one
                if name in where and values[name]:
                    raise TypeError(f"{self.name}: both {name} and its old name {key} given")
                aliased[key] = name
            elif name in where:
                raise TypeError(f"{self.name}: argument {name} given twice (positionally and as a keyword)")
            if name in values or name in self.ignored:
                values[name], where[name] = a, ("kw", key)
            else:
                unknown[key] = a
        missing = [n for n, d in self.params if d is _NO and n not in where]
        if missing:
            raise TypeError(f"{self.name}: missing required argument(s) {', '.join(missing)}")
        return Call(self, values, where, unknown, aliased)


class Call:
    """One bound call: see KernelSpec.bind."""

    def __init__(self, spec, values, where, unknown, aliased):
        self.spec, self.values, self.where, self.unknown, self.aliased = spec, values, where, unknown, aliased

    def get(self, name, default=None):
        v = self.values.get(name, default)
        return default if v is None else v

    def given(self, name):
        return name in self.where

    def replace(self, name, value, args, kwargs):
        """Puts `value` where argument `name` was passed in the (mutable) args list / kwargs dict."""
        kind, key = self.where[name]
        if kind == "pos":
            args[key] = value
        else:
            kwargs[key] = value


_STATE_ALIAS = {"transpose_state_layout": "state_v_first"}
_HEAD_FIRST = {"head_first": "head_first was removed from FLA; pass [B, T, H, ...] tensors"}

SPECS = {
    "chunk_kda": KernelSpec("chunk_kda", "kda", _KDA_PARAMS,
                            routes=(("A_log", None), ("dt_bias", None), ("chunk_size", 64)),
                            aliases=_STATE_ALIAS, refused=_HEAD_FIRST, chunk_sizes=(32, 64)),
    "chunk_gated_delta_rule": KernelSpec(
        "chunk_gated_delta_rule", "gdn", _GDN_PARAMS,
        routes=(("use_gate_in_kernel", False), ("A_log", None), ("dt_bias", None), ("chunk_size", 64)),
        aliases=_STATE_ALIAS, ignored=("safe_gate", "lower_bound"), refused=_HEAD_FIRST, chunk_sizes=(16, 32, 64)),
    "chunk_gla": KernelSpec("chunk_gla", "gla", _GLA_PARAMS),
}
SPECS["chunk_gdn"] = SPECS["chunk_gated_delta_rule"]
OP_KERNEL = {"kda": "chunk_kda", "gdn": "chunk_gated_delta_rule", "gla": "chunk_gla"}


def kernel_name(fn):
    """The function name behind a kernel object (functools.partial and functools.wraps unwrapped)."""
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return getattr(fn, "__name__", type(fn).__name__)


def spec_for(kernel, name=None, op=None):
    """The KernelSpec of `kernel` (by its function name, or `name`, or `op`); an error names what is
    supported when the kernel is not one of them."""
    key = name or (OP_KERNEL.get(op) if op else None) or kernel_name(kernel)
    if key not in SPECS:
        raise ValueError(f"kcp_dump: unsupported kernel {key!r}: kcp judges {', '.join(sorted(SPECS))} "
                         f"(pass kernel_name= if yours is one of them under another name)")
    return SPECS[key]
