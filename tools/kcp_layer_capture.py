"""Capture a KDA / GDN layer into a kcp dump's /layer section (docs/DUMP_FORMAT.md section 7).

Self-contained (torch, numpy, h5py). Two parts:

* ``KDALayer``: a plain PyTorch module written from the MaxText KDA design (ALGORITHMS.md 7.1):
  projections (fused ``in_proj`` [q,k,v,g,gate] or split, LoRA g / output gate, g bias),
  ``conv1d`` (depthwise causal, SiLU) over [q|k|v], L2 norm of q and k, beta = sigmoid(beta_proj x),
  the kernel (token recurrence with the in-kernel gate ``kernel.gate``: softplus, or lower_bound), gated
  RMSNorm (sigmoid for KDA, silu for GDN) and ``out_proj``; packed sequences (cu_seqlens) and
  MaxText's padding of T to a multiple of 64. Every stage is a sub-module so hooks can see it.
* ``capture_layer(module, x, path, ...)``: forward hooks on the sub-modules record every stage,
  ``out.backward(dout)`` gives dx and the weight gradients, and the file is written with h5py. A
  module of another design can be captured by giving it the same sub-module names (or subclassing).

Run ``kcp check FILE``: every stage is compared with kcp's float64 layer oracle and the first stage
that departs is named. Covered by tests/tools/test_kcp_layer_capture.py (ctest label tools).
"""
import math

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class CausalConv(nn.Module):
    """y = silu(b + sum_i w[:, i] x[t-(W-1)+i]) per channel; zero history at every sequence start."""

    def __init__(self, D, W, bias, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(D, W, dtype=dtype) / math.sqrt(W))
        self.bias = nn.Parameter(0.1 * torch.randn(D, dtype=dtype)) if bias else None

    def forward(self, x, cu_seqlens=None):  # x [B,T,D]
        W = self.weight.shape[1]
        seqs = [(b, 0, x.shape[1]) for b in range(x.shape[0])] if cu_seqlens is None else \
            [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]
        out = []
        for b, t0, t1 in seqs:
            xs = F.pad(x[b, t0:t1].t().unsqueeze(0), (W - 1, 0))  # [1,D,L+W-1]
            out.append(F.conv1d(xs, self.weight.unsqueeze(1), self.bias, groups=x.shape[2])[0].t())
        y = torch.stack(out) if cu_seqlens is None else torch.cat(out).unsqueeze(0)
        return F.silu(y)


class L2Norm(nn.Module):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, x):  # [..., D]
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + self.eps)


class DecayGate(nn.Module):
    """The in-kernel gate (ALGORITHMS.md 2.2): raw g [B,T,HV,K] (kda) or [B,T,HV] (gdn) -> natural-log
    decay a of the same shape: lower_bound * sigmoid(exp(A_log) (g + dt_bias)), or softplus form."""

    def __init__(self, variant, HV, K, lower_bound, dtype):
        super().__init__()
        self.variant, self.lower_bound = variant, lower_bound
        self.A_log = nn.Parameter(torch.log(torch.empty(HV, dtype=dtype).uniform_(0.5, 2)))
        self.dt_bias = nn.Parameter(0.5 * torch.randn(HV * K if variant == "kda" else HV, dtype=dtype))

    def forward(self, g):
        HV = self.A_log.shape[0]
        x = g + (self.dt_bias.view(HV, -1) if self.variant == "kda" else self.dt_bias)
        c = torch.exp(self.A_log).view(HV, 1) if self.variant == "kda" else torch.exp(self.A_log)
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(c * x)
        return -c * F.softplus(x)


class DeltaKernel(nn.Module):
    """KDA / GDN token recurrence with the in-kernel gate (ALGORITHMS.md 2.2-2.4), GVA by hv // G:
    S <- diag(exp(a_t)) S;  e = v_t - S^T k_t;  S <- S + beta_t k_t e^T;  o_t = scale S^T q_t."""

    def __init__(self, variant, HV, K, lower_bound, dtype):
        super().__init__()
        self.gate = DecayGate(variant, HV, K, lower_bound, dtype)

    def forward(self, q, k, v, g, beta, cu_seqlens=None):
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        q, k = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
        a = self.gate(g)
        if a.dim() == 3:
            a = a.unsqueeze(-1).expand(B, T, HV, K)
        seqs = [(b, 0, T) for b in range(B)] if cu_seqlens is None else \
            [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]
        o = torch.zeros_like(v).unbind(0)
        o = [list(x.unbind(0)) for x in o]
        finals = []
        for b, t0, t1 in seqs:
            S = q.new_zeros(HV, K, V)
            for t in range(t0, t1):
                S = torch.exp(a[b, t]).unsqueeze(-1) * S
                e = v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t])
                S = S + beta[b, t].view(HV, 1, 1) * k[b, t].unsqueeze(-1) * e.unsqueeze(1)
                o[b][t] = K ** -0.5 * torch.einsum("hkv,hk->hv", S, q[b, t])
            finals.append(S)
        return torch.stack([torch.stack(r) for r in o]), torch.stack(finals)


class GatedRMSNorm(nn.Module):
    """y = x / sqrt(mean_V x^2 + eps) * w * act(z) per head; act = sigmoid (KDA) or silu (GDN)."""

    def __init__(self, V, act, eps, dtype):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(V, dtype=dtype))
        self.act, self.eps = act, eps

    def forward(self, o, z):
        n = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + self.eps) * self.weight
        return n * (torch.sigmoid(z) if self.act == "sigmoid" else F.silu(z))


def _linear(i, o, dtype, bias=False):
    return nn.Linear(i, o, bias=bias, dtype=dtype)


class KDALayer(nn.Module):
    def __init__(self, hidden, H, HV, K, V, variant="kda", conv_size=4, conv_bias=False, fused_in_proj=False,
                 g_lora_rank=0, gate_lora_rank=0, g_bias=False, lower_bound=-5.0, safe_gate=True, norm_eps=1e-5,
                 pad_multiple=0, dtype=torch.float64):
        super().__init__()
        c = dict(hidden=hidden, H=H, HV=HV, K=K, V=V, conv_size=conv_size, conv_bias=conv_bias,
                 fused_in_proj=fused_in_proj, g_lora_rank=g_lora_rank, gate_lora_rank=gate_lora_rank, g_bias=g_bias,
                 qk_l2norm=True, l2norm_eps=1e-6, lower_bound=lower_bound if variant == "kda" else None,
                 safe_gate=safe_gate and variant == "kda", output_gate="sigmoid" if variant == "kda" else "silu",
                 norm_eps=norm_eps, scale=K ** -0.5, pad_multiple=pad_multiple, chunk_size=64)
        self.variant, self.config = variant, c
        self.Dg = HV * K if variant == "kda" else HV
        qkv = 2 * H * K + HV * V
        if fused_in_proj:
            rows = qkv + (0 if g_lora_rank else self.Dg) + (0 if gate_lora_rank else HV * V)
            self.in_proj = _linear(hidden, rows, dtype)
        else:
            self.q_proj, self.k_proj, self.v_proj = (_linear(hidden, n, dtype) for n in (H * K, H * K, HV * V))
            if not g_lora_rank:
                self.g_proj = _linear(hidden, self.Dg, dtype)
            if not gate_lora_rank:
                self.gate_proj = _linear(hidden, HV * V, dtype)
        if g_lora_rank:
            self.g_lora_a, self.g_lora_b = _linear(hidden, g_lora_rank, dtype), _linear(g_lora_rank, self.Dg, dtype)
        if gate_lora_rank:
            self.gate_lora_a = _linear(hidden, gate_lora_rank, dtype)
            self.gate_lora_b = _linear(gate_lora_rank, HV * V, dtype)
        self.g_bias = nn.Parameter(0.1 * torch.randn(self.Dg, dtype=dtype)) if g_bias else None
        self.beta_proj = _linear(hidden, HV, dtype)
        self.conv1d = CausalConv(qkv, conv_size, conv_bias, dtype)
        self.q_norm, self.k_norm = L2Norm(), L2Norm()
        self.kernel = DeltaKernel(variant, HV, K, c["lower_bound"], dtype)
        self.out_norm = GatedRMSNorm(V, c["output_gate"], norm_eps, dtype)
        self.out_proj = _linear(HV * V, hidden, dtype)

    def project(self, x):
        c, qkv = self.config, 2 * self.config["H"] * self.config["K"] + self.config["HV"] * self.config["V"]
        if c["fused_in_proj"]:
            z = self.in_proj(x)
            p, rest = z[..., :qkv], z[..., qkv:]
            g = None if c["g_lora_rank"] else rest[..., :self.Dg]
            gate = None if c["gate_lora_rank"] else rest[..., rest.shape[-1] - c["HV"] * c["V"]:]
        else:
            p = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)
            g = None if c["g_lora_rank"] else self.g_proj(x)
            gate = None if c["gate_lora_rank"] else self.gate_proj(x)
        if g is None:
            g = self.g_lora_b(self.g_lora_a(x))
        if self.g_bias is not None:
            g = g + self.g_bias
        if gate is None:
            gate = self.gate_lora_b(self.gate_lora_a(x))
        return p, g, gate

    def forward(self, x, cu_seqlens=None):
        c = self.config
        B, T0, _ = x.shape
        H, HV, K, V, m = c["H"], c["HV"], c["K"], c["V"], c["pad_multiple"]
        if m and T0 % m:  # MaxText: zeros at the end of T, cut back after out_proj
            assert cu_seqlens is None, "padding is for dense batches"
            x = F.pad(x, (0, 0, 0, m - T0 % m))
        T = x.shape[1]
        p, g, gate = self.project(x)
        self.qkv_proj_out = p
        y = self.conv1d(p, cu_seqlens)
        q = self.q_norm(y[..., :H * K].reshape(B, T, H, K))
        k = self.k_norm(y[..., H * K:2 * H * K].reshape(B, T, H, K))
        v = y[..., 2 * H * K:].reshape(B, T, HV, V)
        beta = torch.sigmoid(self.beta_proj(x))
        g = g.reshape(B, T, HV, K) if self.variant == "kda" else g
        o, _ = self.kernel(q, k, v, g, beta, cu_seqlens)
        out = self.out_proj(self.out_norm(o, gate.reshape(B, T, HV, V)).reshape(B, T, HV * V))
        return out[:, :T0]

    def kcp_params(self):
        """kcp's weight names (reference/layer.h layer_param_specs) -> this module's parameters."""
        m = {"beta_proj.weight": self.beta_proj.weight, "conv1d.weight": self.conv1d.weight,
             "A_log": self.kernel.gate.A_log, "dt_bias": self.kernel.gate.dt_bias, "out_norm.weight": self.out_norm.weight,
             "out_proj.weight": self.out_proj.weight}
        for name in ("in_proj", "q_proj", "k_proj", "v_proj", "g_proj", "gate_proj"):
            if hasattr(self, name):
                m[name + ".weight"] = getattr(self, name).weight
        for base in ("g", "gate"):
            if hasattr(self, base + "_lora_a"):
                m[base + "_proj.lora_a"] = getattr(self, base + "_lora_a").weight
                m[base + "_proj.lora_b"] = getattr(self, base + "_lora_b").weight
        if self.g_bias is not None:
            m["g_proj.bias"] = self.g_bias
        if self.conv1d.bias is not None:
            m["conv1d.bias"] = self.conv1d.bias
        return m


# --- capture -----------------------------------------------------------------------------------------

def _hooks(module, rec):
    """Forward hooks that record each stage under kcp's names (reference/layer.h LayerStages), and
    tensor hooks that record the gradient at each stage as "d" + name (dq, do, dqkv_conv, ...)."""
    def keep(name, t):
        rec[name] = t
        if t.requires_grad:
            t.register_hook(lambda g: rec.__setitem__("d" + name, g))

    def on(name, fn):
        return getattr(module, name).register_forward_hook(fn)

    def out_norm(_, inp, out):  # a forward hook must return None (a value would replace the output)
        keep("y", out)
        keep("gate", inp[1])

    def kernel(_, inp, out):
        keep("qkv_proj", module.qkv_proj_out)
        for n, t in zip(("q", "k", "v", "g", "beta"), inp[:5]):
            keep(n, t)
        keep("o", out[0])
        rec["final_state"] = out[1]
    return [on("conv1d", lambda _, i, o: keep("qkv_conv", o)),
            on("beta_proj", lambda _, i, o: keep("beta_logit", o)),
            on("out_norm", out_norm),
            on("out_proj", lambda _, i, o: rec.__setitem__("out", o)),
            module.kernel.gate.register_forward_hook(lambda _, i, o: rec.__setitem__("a", o)),
            on("kernel", kernel)]


def _put(grp, name, t, T=None):
    """One dataset; bf16 / fp16 tensors are widened exactly to float32, labelled with their dtype
    (docs/DUMP_FORMAT.md section 3, encoding "ieee")."""
    a = t.detach().cpu()
    if T is not None and a.dim() >= 2:
        a = a[:, :T]
    if a.dtype in (torch.bfloat16, torch.float16):
        a = a.float()
    ds = grp.create_dataset(name, data=a.contiguous().numpy())
    ds.attrs["dtype"] = str(t.dtype).replace("torch.", "")
    ds.attrs["encoding"] = "ieee"


def capture_layer(module, x, path, cu_seqlens=None, dout=None, source="maxtext-design"):
    """Runs module(x) (and the backward with dout when given), writes the /layer dump to path."""
    c = module.config
    rec = {}
    hooks = _hooks(module, rec)
    x = x.detach().clone().requires_grad_(True)
    try:
        out = module(x, cu_seqlens)
    finally:
        for h in hooks:
            h.remove()
    params = module.kcp_params()
    if dout is not None:
        for p in params.values():
            p.grad = None
        out.backward(dout)
    T = x.shape[1]
    with h5py.File(path, "w") as f:
        f.attrs.update({"format": "kcp-dump", "format_version": np.int64(2), "op": module.variant,
                        "capture_point": "layer", "source_framework": source, "layout": "BSHD"})
        lg = f.create_group("layer")
        for k, v in c.items():
            lg.attrs[k] = np.bool_(v) if isinstance(v, bool) else (float("nan") if v is None else v)
        lg.attrs["layout"] = "BSHD"
        _put(lg, "x", x)
        if cu_seqlens is not None:
            lg.create_dataset("cu_seqlens", data=np.asarray(cu_seqlens, dtype=np.int64))
        for name, t in rec.items():  # stages, and after the backward the gradients at them
            _put(lg, name, t, None if name == "final_state" else T)
        pg = f.create_group("layer/params")
        for name, p in params.items():
            _put(pg, name, p)
        if dout is not None:
            _put(lg, "dout", dout)
            _put(lg, "dx", x.grad)
            gg = f.create_group("layer/grads")
            for name, p in params.items():
                _put(gg, name, p.grad)
    return out.detach()
