"""A stand-in for Megatron-LM's KDA and GatedDeltaNet layers, for tests/tools/test_kcp_megatron_capture.py.

Written from the layer as Megatron runs it (docs/ALGORITHMS.md section 7; no Megatron code here), on one
tensor-parallel rank, in the parts the /layer format expresses (docs/DUMP_FORMAT.md section 7):

  hidden_states [S,B,hidden] (Megatron's SBHD)
  in_proj (returns (y, bias) like ColumnParallelLinear), one fused projection:
      kda: [q, k, v, g, gate] = [qk, qk, v, qk, v] rows, beta from b_proj (separate)
      gdn: [q, k, v, z, beta, alpha] (Megatron's GatedDeltaNet order; alpha is the raw gate g, z the
           output gate); the capture reorders the rows to kcp's [q, k, v, g, gate] + beta_proj
  transpose to [B,S,...]; conv1d: nn.Conv1d weight [D,1,W], depthwise causal over channels-first
      [B,D,S] with SiLU (causal_conv1d_fn(activation="silu")), zero history at each packed start
  q, k: L2 norm per head outside the kernel (use_qk_l2norm_in_kernel=False); beta = sigmoid(b)
  kernel (a sub-module here so hooks can see its inputs; Megatron calls a function): the token
      recurrence with the in-kernel gate (A_log, dt_bias are parameters of the layer itself):
      kda: a = lower_bound * sigmoid(exp(A_log) (g + dt_bias))  (Ling3, lower_bound = -5, safe_gate)
      gdn: a = -exp(A_log) softplus(g + dt_bias)
      S <- diag(exp a_t) S;  e = v_t - S^T k_t;  S <- S + beta_t k_t e^T;  o_t = K^-0.5 S^T q_t
  out_norm: per-head RMSNorm(o) * weight * act(gate), act = sigmoid (kda) or silu (gdn)
  out_proj (returns (out, bias) like RowParallelLinear), back in [S,B,hidden]

Not modelled (not expressible in /layer): Megatron's fused pre-norm inside in_proj
(TELayerNormColumnParallelLinear's layer_norm_weight), tensor parallelism, LoRA g / output gate
factors of Megatron's KDA (the MaxText-design KDALayer covers LoRA). Any dtype; float64 for the oracle.
"""
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class ParallelLinear(nn.Linear):
    """Column/RowParallelLinear on one rank with skip_bias_add: returns (x W^T, None)."""

    def __init__(self, n_in, n_out, dtype):
        super().__init__(n_in, n_out, bias=False, dtype=dtype)
        nn.init.normal_(self.weight, std=n_in ** -0.5)

    def forward(self, x):
        return super().forward(x), None


class CausalConv1d(nn.Conv1d):
    """Depthwise causal conv + SiLU on x [B,D,S]; weight [D,1,W]; packed sequences restart (B = 1)."""

    def __init__(self, D, W, bias, dtype):
        super().__init__(D, D, W, groups=D, bias=bias, dtype=dtype)

    def forward(self, x, cu_seqlens=None):
        W = self.kernel_size[0]
        cu = [0, x.shape[2]] if cu_seqlens is None else [int(c) for c in cu_seqlens]
        parts = [F.conv1d(F.pad(x[..., a:b], (W - 1, 0)), self.weight, self.bias, groups=self.groups)
                 for a, b in zip(cu[:-1], cu[1:])]
        return F.silu(torch.cat(parts, -1))


class InKernelGate(nn.Module):
    """g [B,S,HV,K] (kda) or [B,S,HV] (gdn) -> log decay a, same shape; no parameters of its own."""

    def __init__(self, lower_bound):
        super().__init__()
        self.lower_bound = lower_bound

    def forward(self, g, A_log, dt_bias):
        HV = A_log.shape[0]
        per_key = g.dim() == 4
        x = g + (dt_bias.view(HV, -1) if per_key else dt_bias)
        c = torch.exp(A_log).view(HV, 1) if per_key else torch.exp(A_log)
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(c * x)
        return -c * F.softplus(x)


class DeltaRuleKernel(nn.Module):
    """Naive token recurrence (see the file header); q, k [B,S,H,K] repeated to HV heads (hv // G)."""

    def __init__(self, lower_bound):
        super().__init__()
        self.gate = InKernelGate(lower_bound)

    def forward(self, q, k, v, g, beta, A_log, dt_bias, cu_seqlens=None):
        B, S, H, K = q.shape
        HV = v.shape[2]
        q, k = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
        a = self.gate(g, A_log, dt_bias)
        if a.dim() == 3:
            a = a.unsqueeze(-1).expand(B, S, HV, K)
        spans = [(b, 0, S) for b in range(B)] if cu_seqlens is None else \
            [(0, int(t0), int(t1)) for t0, t1 in zip(cu_seqlens[:-1], cu_seqlens[1:])]
        rows = [[None] * S for _ in range(B)]
        finals = []
        for b, t0, t1 in spans:
            state = q.new_zeros(HV, K, v.shape[3])
            for t in range(t0, t1):
                state = state * torch.exp(a[b, t]).unsqueeze(-1)
                err = v[b, t] - (state * k[b, t].unsqueeze(-1)).sum(1)
                state = state + beta[b, t].view(HV, 1, 1) * k[b, t].unsqueeze(-1) * err.unsqueeze(1)
                rows[b][t] = (state * q[b, t].unsqueeze(-1)).sum(1) / math.sqrt(K)
            finals.append(state)
        return torch.stack([torch.stack(r) for r in rows]), torch.stack(finals)


class GatedRMSNorm(nn.Module):
    """y = o / sqrt(mean_V o^2 + eps) * weight * act(gate), per head; o, gate [B,S,HV,V]."""

    def __init__(self, V, act, eps, dtype):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(V, dtype=dtype))
        self.act, self.eps = act, eps

    def forward(self, o, gate):
        n = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + self.eps) * self.weight
        return n * (torch.sigmoid(gate) if self.act == "sigmoid" else F.silu(gate))


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class MegatronDeltaLayer(nn.Module):
    """variant "kda" (Megatron's KDA) or "gdn" (GatedDeltaNet); forward(hidden_states [S,B,hidden],
    cu_seqlens=None) -> (out [S,B,hidden], None) like Megatron's modules."""

    def __init__(self, variant, hidden, H, HV, K, V, conv_size=4, conv_bias=False, lower_bound=-5.0,
                 norm_eps=1e-5, dtype=torch.float64):
        super().__init__()
        kda = variant == "kda"
        self.variant = variant
        self.config = SimpleNamespace(hidden_size=hidden, linear_num_key_heads=H, linear_num_value_heads=HV,
                                      linear_key_head_dim=K, linear_value_head_dim=V, linear_conv_kernel_dim=conv_size)
        self.lower_bound = lower_bound if kda else None
        self.conv_dim = 2 * H * K + HV * V
        if kda:
            self.in_proj = ParallelLinear(hidden, self.conv_dim + HV * K + HV * V, dtype)
            self.b_proj = ParallelLinear(hidden, HV, dtype)
        else:
            self.in_proj = ParallelLinear(hidden, self.conv_dim + HV * V + 2 * HV, dtype)
        self.conv1d = CausalConv1d(self.conv_dim, conv_size, conv_bias, dtype)
        self.A_log = nn.Parameter(torch.log(torch.empty(HV, dtype=dtype).uniform_(0.5, 2)))
        self.dt_bias = nn.Parameter(0.5 * torch.randn(HV * K if kda else HV, dtype=dtype))
        self.kernel = DeltaRuleKernel(self.lower_bound)
        self.out_norm = GatedRMSNorm(V, "sigmoid" if kda else "silu", norm_eps, dtype)
        self.out_proj = ParallelLinear(HV * V, hidden, dtype)

    def beta_act(self, b):  # a method so a test can plant a bug in it
        return torch.sigmoid(b)

    def split(self, zx, hidden_states):
        """in_proj output [B,S,rows] -> qkv, g, gate, b (b from b_proj for kda)."""
        c = self.config
        HV, V = c.linear_num_value_heads, c.linear_value_head_dim
        if self.variant == "kda":
            qkv, g, gate = torch.split(zx, [self.conv_dim, HV * c.linear_key_head_dim, HV * V], -1)
            b = self.b_proj(hidden_states)[0].transpose(0, 1)
        else:
            qkv, gate, b, g = torch.split(zx, [self.conv_dim, HV * V, HV, HV], -1)
        return qkv, g, gate, b

    def forward(self, hidden_states, cu_seqlens=None):
        c = self.config
        S, B, _ = hidden_states.shape
        H, HV, K, V = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        zx = self.in_proj(hidden_states)[0].transpose(0, 1)  # [B,S,rows]
        qkv, g, gate, b = self.split(zx, hidden_states)
        qkv = self.conv1d(qkv.transpose(1, 2), cu_seqlens).transpose(1, 2)
        q, k, v = torch.split(qkv, [H * K, H * K, HV * V], -1)
        q, k = l2norm(q.reshape(B, S, H, K)), l2norm(k.reshape(B, S, H, K))
        g = g.reshape(B, S, HV, K) if self.variant == "kda" else g
        o, _ = self.kernel(q, k, v.reshape(B, S, HV, V), g, self.beta_act(b), self.A_log, self.dt_bias, cu_seqlens)
        y = self.out_norm(o, gate.reshape(B, S, HV, V))
        return self.out_proj(y.reshape(B, S, HV * V).transpose(0, 1))
