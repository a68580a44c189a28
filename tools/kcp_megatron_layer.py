"""Capture a Megatron-style KDA / GatedDeltaNet layer into a kcp /layer dump (docs/DUMP_FORMAT.md section 7).

``capture_megatron_layer(module, hidden_states, path, cu_seqlens=None, dout=None)`` registers forward
hooks on the module's sub-modules, runs ``module(hidden_states, cu_seqlens)`` (and the backward with
dout), maps Megatron's parameter names to kcp's and writes the dump with layout "SBHD" (every token
tensor [S,B,...], Megatron's order; the reader swaps the first two axes back).

The module is expected to look like Megatron's (tests/tools/megatron_standin.py is written that way):
hidden_states [S,B,hidden]; ``module.config`` with hidden_size, linear_num_key_heads,
linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim;
sub-modules, all of whose outputs may be (tensor, bias) tuples:

  in_proj   fused projection, [q,k,v,g,gate] (kda, with a b_proj for beta) or [q,k,v,z,beta,alpha] (gdn)
  b_proj    kda only: beta logits                                       -> /layer/params/beta_proj.weight
  conv1d    depthwise causal conv + SiLU on [B,D,S], weight [D,1,W]     -> conv1d.weight [D,W], conv1d.bias
  kernel    optional: forward(q, k, v, g, beta, ...) -> (o, final_state); its child ``gate`` gives a
  out_norm  (or ``norm``) forward(o, gate) -> y, weight [V]              -> out_norm.weight
  out_proj  [S,B,HV*V] -> [S,B,hidden]
  A_log [HV], dt_bias [HV*K] (kda) or [HV] (gdn): parameters of the layer itself
  lower_bound (attribute, kda): the Ling3 gate's bound, None for the softplus gate

Without a ``kernel`` sub-module (Megatron calls the kernel as a function) the capture still records
in_proj, conv, o, gate, y, out and their gradients; q, k, beta and a are then not judged. A
sub-module or parameter outside this list, or a missing one, is an error that names it.
Covered by tests/tools/test_kcp_megatron_capture.py (ctest label tools).
"""
import h5py
import numpy as np
import torch

from kcp_layer_capture import _put

KNOWN_CHILDREN = ("in_proj", "b_proj", "conv1d", "kernel", "out_norm", "norm", "out_proj")
CONFIG_FIELDS = ("hidden_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim")


class CaptureError(ValueError):
    pass


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _spec(module):
    """Variant, sizes and the kcp config of a Megatron-style module; checks its sub-modules."""
    for name, _ in module.named_children():
        if name not in KNOWN_CHILDREN:
            raise CaptureError(f"megatron capture: unknown sub-module '{name}' (expected {', '.join(KNOWN_CHILDREN)})")
    for name in ("in_proj", "conv1d", "out_proj"):
        if not hasattr(module, name):
            raise CaptureError(f"megatron capture: missing sub-module '{name}'")
    if not (hasattr(module, "out_norm") or hasattr(module, "norm")):
        raise CaptureError("megatron capture: missing sub-module 'out_norm' (or 'norm')")
    cfg = getattr(module, "config", None)
    missing = [f for f in CONFIG_FIELDS if not hasattr(cfg, f)]
    if missing:
        raise CaptureError(f"megatron capture: module.config lacks {', '.join(missing)}")
    hidden, H, HV, K, V, W = (int(getattr(cfg, f)) for f in CONFIG_FIELDS)
    variant = getattr(module, "variant", None) or ("kda" if hasattr(module, "b_proj") else "gdn")
    if variant not in ("kda", "gdn"):
        raise CaptureError(f"megatron capture: module.variant '{variant}': expected kda or gdn")
    lb = getattr(module, "lower_bound", None) if variant == "kda" else None
    norm = module.out_norm if hasattr(module, "out_norm") else module.norm
    config = dict(hidden=hidden, H=H, HV=HV, K=K, V=V, conv_size=W, conv_bias=module.conv1d.bias is not None,
                  fused_in_proj=True, g_lora_rank=0, gate_lora_rank=0, g_bias=False, qk_l2norm=True,
                  l2norm_eps=1e-6, lower_bound=float("nan") if lb is None else float(lb),
                  safe_gate=lb is not None, output_gate="sigmoid" if variant == "kda" else "silu",
                  norm_eps=float(getattr(norm, "eps", 1e-5)), scale=K ** -0.5, pad_multiple=0, chunk_size=64)
    return variant, config, norm


def _sections(variant, c):
    """in_proj output sections, in Megatron's order: (kcp name, width)."""
    cd, HV, K, V = 2 * c["H"] * c["K"] + c["HV"] * c["V"], c["HV"], c["K"], c["V"]
    if variant == "kda":
        return [("qkv_proj", cd), ("g", HV * K), ("gate", HV * V)]
    return [("qkv_proj", cd), ("gate", HV * V), ("beta_logit", HV), ("g", HV)]


def _weights(module, variant, c, grad):
    """kcp's weight names -> tensors (values or gradients); Megatron's names mapped, GDN rows reordered."""
    def get(owner, attr, label):
        p = getattr(owner, attr, None)
        if not isinstance(p, torch.nn.Parameter):
            raise CaptureError(f"megatron capture: missing parameter '{label}'")
        if grad and p.grad is None:
            raise CaptureError(f"megatron capture: parameter '{label}' got no gradient")
        return p.grad if grad else p
    norm = module.out_norm if hasattr(module, "out_norm") else module.norm
    w_in = get(module.in_proj, "weight", "in_proj.weight")
    m = {"conv1d.weight": get(module.conv1d, "weight", "conv1d.weight").reshape(-1, c["conv_size"]),
         "A_log": get(module, "A_log", "A_log"), "dt_bias": get(module, "dt_bias", "dt_bias"),
         "out_norm.weight": get(norm, "weight", "out_norm.weight"),
         "out_proj.weight": get(module.out_proj, "weight", "out_proj.weight")}
    if c["conv_bias"]:
        m["conv1d.bias"] = get(module.conv1d, "bias", "conv1d.bias")
    if variant == "kda":
        m["in_proj.weight"] = w_in
        m["beta_proj.weight"] = get(module.b_proj, "weight", "b_proj.weight")
    else:  # [q,k,v,z,beta,alpha] -> in_proj [q,k,v,g=alpha,gate=z] + beta_proj
        rows = dict(zip([n for n, _ in _sections(variant, c)],
                        torch.split(w_in, [w for _, w in _sections(variant, c)], 0)))
        m["in_proj.weight"] = torch.cat([rows["qkv_proj"], rows["g"], rows["gate"]], 0)
        m["beta_proj.weight"] = rows["beta_logit"]
    return m


def _check_parameters(module):
    """Every parameter of the module must be one the mapping knows."""
    known = {"in_proj.weight", "b_proj.weight", "conv1d.weight", "conv1d.bias", "A_log", "dt_bias",
             "out_norm.weight", "norm.weight", "out_proj.weight"}
    for name, _ in module.named_parameters():
        if name == "in_proj.layer_norm_weight" or name == "in_proj.layer_norm_bias":
            raise CaptureError(f"megatron capture: parameter '{name}': in_proj's fused pre-norm "
                               "(TELayerNormColumnParallelLinear) is not expressible in /layer")
        if name not in known:
            raise CaptureError(f"megatron capture: parameter '{name}' has no place in the /layer format")


def _hooks(module, norm, rec):
    """Forward hooks recording (tensor, to_bshd) per stage; tensor hooks record the gradient as d<name>."""
    def keep(name, t, to_bshd=lambda x: x):
        rec[name] = (t, to_bshd)
        if t.requires_grad and name != "out":  # d(out) is dout itself
            t.register_hook(lambda g: rec.__setitem__("d" + name, (g, to_bshd)))

    def sb(x):  # [S,B,...] -> [B,S,...]
        return x.transpose(0, 1)

    def channels_first(x):  # conv1d's [B,D,S] -> [B,S,D]
        return x.transpose(1, 2)

    def kernel(_, inp, out):
        for n, t in zip(("q", "k", "v", "g", "beta"), inp[:5]):
            keep(n, t)
        rec["final_state"] = (out[1], lambda x: x)

    def out_norm(_, inp, out):
        keep("o", inp[0])
        keep("gate_used", inp[1])
        keep("y", _first(out))

    hooks = [module.in_proj.register_forward_hook(lambda _, i, o: keep("in_proj_out", _first(o), sb)),
             module.conv1d.register_forward_hook(lambda _, i, o: keep("qkv_conv", _first(o), channels_first)),
             norm.register_forward_hook(out_norm),
             module.out_proj.register_forward_hook(lambda _, i, o: keep("out", _first(o), sb))]
    if hasattr(module, "b_proj"):
        hooks.append(module.b_proj.register_forward_hook(lambda _, i, o: keep("beta_logit", _first(o), sb)))
    if hasattr(module, "kernel"):
        hooks.append(module.kernel.register_forward_hook(kernel))
        if hasattr(module.kernel, "gate"):
            hooks.append(module.kernel.gate.register_forward_hook(lambda _, i, o: keep("a", _first(o))))
    return hooks


def _stages(rec, variant, c):
    """The recorded tensors as kcp's stages, [B,S,...]: in_proj's output split into its sections
    (where no later hook saw the same tensor), out_norm's gate input as "gate"."""
    B, S = rec["in_proj_out"][1](rec["in_proj_out"][0]).shape[:2]
    shapes = {"g": (B, S, c["HV"], c["K"]) if variant == "kda" else (B, S, c["HV"]),
              "gate": (B, S, c["HV"], c["V"])}
    out = {}
    for prefix in ("", "d"):
        if prefix + "in_proj_out" not in rec:
            continue
        z = rec[prefix + "in_proj_out"][1](rec[prefix + "in_proj_out"][0])
        parts = torch.split(z, [w for _, w in _sections(variant, c)], -1)
        for (n, _), t in zip(_sections(variant, c), parts):
            out[prefix + n] = t.reshape(shapes.get(n, t.shape))
    for name, (t, f) in rec.items():
        if name.endswith("in_proj_out"):
            continue
        out[name.replace("gate_used", "gate")] = f(t)
    return out


def capture_megatron_layer(module, hidden_states, path, cu_seqlens=None, dout=None, source="megatron"):
    """Runs module(hidden_states [S,B,hidden], cu_seqlens) (and the backward with dout [S,B,hidden]),
    writes the /layer dump to path with layout SBHD. Returns the output, detached."""
    variant, c, norm = _spec(module)
    _check_parameters(module)
    _weights(module, variant, c, grad=False)  # fails early on a missing parameter
    rec = {}
    x = hidden_states.detach().clone().requires_grad_(True)
    hooks = _hooks(module, norm, rec)
    try:
        out = _first(module(x, cu_seqlens))
    finally:
        for h in hooks:
            h.remove()
    if dout is not None:
        for p in module.parameters():
            p.grad = None
        out.backward(dout)
    stages = _stages(rec, variant, c)
    with h5py.File(path, "w") as f:
        f.attrs.update({"format": "kcp-dump", "format_version": np.int64(2), "op": variant,
                        "capture_point": "layer", "source_framework": source, "layout": "SBHD"})
        lg = f.create_group("layer")
        for k, v in c.items():
            lg.attrs[k] = np.bool_(v) if isinstance(v, bool) else v
        lg.attrs["layout"] = "SBHD"
        _put(lg, "hidden_in", x)  # Megatron's name; the reader's alias of x
        if cu_seqlens is not None:
            lg.create_dataset("cu_seqlens", data=np.asarray(cu_seqlens, dtype=np.int64))
        for name, t in stages.items():
            _put(lg, name, t if name == "final_state" else t.transpose(0, 1))
        pg = f.create_group("layer/params")
        for name, t in _weights(module, variant, c, grad=False).items():
            _put(pg, name, t)
        if dout is not None:
            _put(lg, "dout", dout)
            _put(lg, "dhidden_in", x.grad)
            gg = f.create_group("layer/grads")
            for name, t in _weights(module, variant, c, grad=True).items():
                _put(gg, name, t)
    return out.detach()
