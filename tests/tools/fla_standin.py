"""Stand-ins for FLA's chunk_kda, chunk_gated_delta_rule and chunk_gla for the CPU capture test: the exact
call signatures of FLA 0.5.2 (bc3b101), including the **kwargs routes (A_log, dt_bias, chunk_size,
gdn's use_gate_in_kernel, transpose_state_layout), with naive float32 torch math (a token loop), so
autograd gives the gradients. Written from ALGORITHMS.md section 2 (FLA's meaning of every flag), no FLA code:
  l2norm  x / sqrt(sum x^2 + 1e-6);  beta  s * sigmoid(b), s = 2 with allow_neg_eigval
  kda gate  -exp(A_log) softplus(g + dt_bias)  or  lb * sigmoid(c (g + dt_bias)), c = exp(A_log) or 1
  gdn gate  -exp(A_log) softplus(g + dt_bias);  value head hv reads q/k head hv // (HV / H)
  delta rule  S <- diag(exp(a_t)) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = scale S^T q_t
  gla         S <- diag(exp(g_t)) S + k_t v_t^T;  o_t = scale S^T q_t
Outputs in v's dtype, final state float32. PLANT = {"o": 0.01} scales o by 1.01 (a planted error);
{"dq": 0.01} scales the gradient of q. Used by tests/tools/test_kcp_capture.py.
With a cp_context whose group is set, the kernels also go through FLA's two exchange points, as
fla.ops.cp.chunk_delta_h has them (docs/CP.md "FLA's own CP judged by kcp"): the forward all-gathers
(S_ext | M) [HV, K, V+K] of the last local sequence unless it ends on this rank, the backward
(dS_ext | M^T) of the first local sequence unless it starts here, zeros otherwise; naive float32 math
from the prepared q, k, v, gate and beta. Nothing gathered is merged (the stand-in passes no state), so
o and the gradients of a sequence cut at a rank edge are those of its local pieces. Used by
tests/tools/test_fla_cp_capture.py through scripts/fla_cp_capture.py, which taps all_gather_into_tensor.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PLANT = {}


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad.double() * ctx.s).to(grad.dtype), None  # in bf16, 1.01 itself would round to 1.0078


@dataclass
class FLACPContext:  # the fields of fla.ops.cp.context.FLACPContext
    group: object = None
    cu_seqlens: torch.Tensor = None
    cu_seqlens_cpu: torch.Tensor = None
    is_last_rank: bool = None
    pre_num_ranks: int = None
    is_first_rank: bool = None
    post_num_ranks: int = None
    conv1d_kernel_size: int = None
    pre_num_conv_tokens: int = None


def _l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _recurrence(q, k, v, a, beta, scale, h0, cu_seqlens, state_v_first, per_channel):
    """q, k [B,T,HV,K] (already expanded), v [B,T,HV,V], a log decay [B,T,HV] or [B,T,HV,K], beta [B,T,HV]
    or None (gla); float32. Returns o [B,T,HV,V] and the final states [N,HV,K,V]."""
    B, T, HV, K = q.shape
    if cu_seqlens is not None:
        seqs = [(0, int(cu_seqlens[i]), int(cu_seqlens[i + 1])) for i in range(len(cu_seqlens) - 1)]
    else:
        seqs = [(b, 0, T) for b in range(B)]
    rows, finals = [[None] * T for _ in range(B)], []
    for n, (b, t0, t1) in enumerate(seqs):
        S = torch.zeros(HV, K, v.shape[-1])
        if h0 is not None:
            S = h0[n].float().transpose(-1, -2) if state_v_first else h0[n].float()
        for t in range(t0, t1):
            decay = torch.exp(a[b, t])
            S = S * (decay[:, :, None] if per_channel else decay[:, None, None])
            if beta is None:
                S = S + k[b, t][:, :, None] * v[b, t][:, None, :]
            else:
                e = v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t])
                S = S + beta[b, t][:, None, None] * k[b, t][:, :, None] * e[:, None, :]
            rows[b][t] = scale * torch.einsum("hkv,hk->hv", S, q[b, t])
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    return torch.stack([torch.stack(r) for r in rows]), torch.stack(finals)


def all_gather_into_tensor(inp, out=None, group=None, async_op=False):
    """FLA's fla.ops.cp.comm.all_gather_into_tensor, here over dist.all_gather (gloo on the CPU)."""
    import torch.distributed as dist
    parts = [torch.empty_like(inp) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, inp.contiguous(), group=group)
    gathered = torch.stack(parts)
    if out is not None:
        out.copy_(gathered)
    return (gathered if out is None else out), None


def _token_maps(k, a, beta, t0, t1):
    """Per token of [t0, t1) the state map A_t = (I - beta_t k_t k_t^T) diag(exp a_t): [n, HV, K, K]."""
    K = k.shape[-1]
    d = torch.exp(a[t0:t1])
    d = d[..., None].expand(-1, -1, K) if d.dim() == 2 else d
    kt = k[t0:t1]
    return (torch.eye(K) - beta[t0:t1, :, None, None] * kt[..., :, None] * kt[..., None, :]) * d[..., None, :]


def _fwd_h_pre_process(cp, args, t0, t1):
    """FLA's forward exchange: (S_ext | M) of the local tokens [t0, t1) (the last local sequence)."""
    q, k, v, a, beta = args
    HV, K, V = k.shape[1], k.shape[2], v.shape[2]
    hm = torch.zeros(HV, K, V + K)
    if not cp.is_last_rank:
        S, M = torch.zeros(HV, K, V), torch.eye(K).repeat(HV, 1, 1)
        for i, A in enumerate(_token_maps(k, a, beta, t0, t1)):
            t = t0 + i
            S = A @ S + beta[t][:, None, None] * k[t][:, :, None] * v[t][:, None, :]
            M = A @ M
        hm[:, :, :V], hm[:, :, V:] = S, M
    all_gather_into_tensor(hm, group=cp.group)


def _bwd_dhu_pre_process(cp, args, t0, t1, scale, do):
    """FLA's backward exchange: (dS_ext | M^T) of [t0, t1) (the first local sequence), dht = 0."""
    q, k, v, a, beta = args
    HV, K, V = k.shape[1], k.shape[2], v.shape[2]
    dhm = torch.zeros(HV, K, V + K)
    if not cp.is_first_rank:
        G, MT = torch.zeros(HV, K, V), torch.eye(K).repeat(HV, 1, 1)
        maps = _token_maps(k, a, beta, t0, t1)
        for i in reversed(range(t1 - t0)):
            G = maps[i].transpose(-1, -2) @ (G + scale * q[t0 + i][:, :, None] * do[t0 + i][:, None, :])
            MT = maps[i].transpose(-1, -2) @ MT
        dhm[:, :, :V], dhm[:, :, V:] = G, MT
    all_gather_into_tensor(dhm, group=cp.group)


class _BwdExchange(torch.autograd.Function):
    """Identity on o whose backward runs FLA's backward exchange with do (before any input gradient)."""
    @staticmethod
    def forward(ctx, o, cp, args, scale):
        ctx.cp, ctx.args, ctx.scale = cp, args, scale
        return o.view_as(o)

    @staticmethod
    def backward(ctx, grad):
        cu = [int(c) for c in ctx.cp.cu_seqlens.tolist()]
        _bwd_dhu_pre_process(ctx.cp, ctx.args, cu[0], cu[1], ctx.scale, grad[0].float())
        return grad, None, None, None


def _cp_exchange(cp, out, q, k, v, a, beta, scale):
    """The forward exchange now, the backward one hooked on o (see the module's docstring)."""
    if cp is None or cp.group is None:
        return out
    args = tuple(x.detach()[0] for x in (q, k, v, a, beta))  # [T, HV, ...], B = 1 under CP
    cu = [int(c) for c in cp.cu_seqlens.tolist()]
    _fwd_h_pre_process(cp, args, cu[-2], cu[-1])
    return (_BwdExchange.apply(out[0], cp, args, scale),) + tuple(out[1:])


def _finish(o, ht, v, output_final_state):
    if "o" in PLANT:
        o = o.double() * (1 + PLANT["o"])
    return o.to(v.dtype), (ht if output_final_state else None)


def _expand(x, HV):
    H = x.shape[2]
    return x if H == HV else x.repeat_interleave(HV // H, dim=2)


def _prep_qk(q, k, HV, l2):
    if "dq" in PLANT:
        q = _ScaleGrad.apply(q, 1 + PLANT["dq"])
    q, k = q.float(), k.float()
    if l2:
        q, k = _l2norm(q), _l2norm(k)
    return _expand(q, HV), _expand(k, HV)


def _prep_beta(beta, sigmoid, neg):
    beta = beta.float()
    return (2 if neg else 1) * torch.sigmoid(beta) if sigmoid else beta


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, **kwargs):
    if "transpose_state_layout" in kwargs:
        state_v_first = kwargs.pop("transpose_state_layout")
    if cp_context is not None:
        assert initial_state is None and not output_final_state
        cu_seqlens = cp_context.cu_seqlens
    A_log, dt_bias = (kwargs.get("A_log"), kwargs.get("dt_bias")) if use_gate_in_kernel else (None, None)
    chunk_size = kwargs.pop("chunk_size", 64)
    assert chunk_size in (32, 64)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    HV, K = v.shape[2], q.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    a = g.float()
    if use_gate_in_kernel:
        x = a + (dt_bias.float().view(HV, K) if dt_bias is not None else 0)
        if lower_bound is not None:
            z = torch.exp(A_log.float())[:, None] * x if A_log is not None else x
            a = lower_bound * torch.sigmoid(z)
        else:
            a = -torch.exp(A_log.float())[:, None] * F.softplus(x)
    qq, kk = _prep_qk(q, k, HV, use_qk_l2norm_in_kernel)
    b = _prep_beta(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, ht = _recurrence(qq, kk, v.float(), a, b, scale, initial_state, cu_seqlens, state_v_first, True)
    return _cp_exchange(cp_context, _finish(o, ht, v, output_final_state), qq, kk, v.float(), a, b, scale)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    if "transpose_state_layout" in kwargs:
        state_v_first = kwargs.pop("transpose_state_layout")
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed.")
    chunk_size = kwargs.pop("chunk_size", 64)
    assert chunk_size in (16, 32, 64)
    if cp_context is not None:
        cu_seqlens = cp_context.cu_seqlens
    use_gate_in_kernel = kwargs.get("use_gate_in_kernel", False)
    A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    HV = v.shape[2]
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    a = g.float()
    if use_gate_in_kernel:
        a = -torch.exp(A_log.float()) * F.softplus(a + (dt_bias.float() if dt_bias is not None else 0))
    qq, kk = _prep_qk(q, k, HV, use_qk_l2norm_in_kernel)
    b = _prep_beta(beta, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    o, ht = _recurrence(qq, kk, v.float(), a, b, scale, initial_state, cu_seqlens, state_v_first, False)
    return _cp_exchange(cp_context, _finish(o, ht, v, output_final_state), qq, kk, v.float(), a, b, scale)


chunk_gdn = chunk_gated_delta_rule


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
              cu_seqlens=None, cu_seqlens_cpu=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qq, kk = _prep_qk(q, k, v.shape[2], False)
    o, ht = _recurrence(qq, kk, v.float(), g.float(), None, scale, initial_state, cu_seqlens, state_v_first, True)
    return _finish(o, ht, v, output_final_state)


def build_cp_context(cu_seqlens, group, conv1d_kernel_size=None, cu_seqlens_cpu=None):
    """FLA's context for this rank of `group` (docs/ALGORITHMS.md 5.1, kcp's cp/context.cpp): equal parts
    of T / P tokens; the local cu_seqlens clamp(cu, lo, hi) - lo without repeats; pre / post ranks of the
    first / last local sequence. The stand-in kernels pass no state between ranks, so a CP test with them
    must cut sequences only at rank edges (every rank then is both first and last)."""
    import torch.distributed as dist
    P, r = dist.get_world_size(group), dist.get_rank(group)
    cu = [int(c) for c in (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).tolist()]
    T = cu[-1]
    if T % P:
        raise ValueError(f"total tokens {T} must be divisible by world size {P}")
    part = T // P
    lo, hi = r * part, (r + 1) * part
    local = []
    for c in cu:
        x = min(max(c, lo), hi) - lo
        if not local or local[-1] != x:
            local.append(x)
    first_start = max(c for c in cu[:-1] if c <= lo)
    last_end = min(c for c in cu[1:] if c >= hi)
    local_t = torch.tensor(local, dtype=torch.int32)
    return FLACPContext(group=group, cu_seqlens=local_t.to(cu_seqlens.device), cu_seqlens_cpu=local_t,
                        is_first_rank=first_start // part == r, pre_num_ranks=r - first_start // part,
                        is_last_rank=(last_end - 1) // part == r, post_num_ranks=(last_end - 1) // part - r,
                        conv1d_kernel_size=conv1d_kernel_size, pre_num_conv_tokens=max(0, lo - first_start))
