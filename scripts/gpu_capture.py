"""Captures real FLA calls on a GPU across the flag matrix of issue 13 with kcp_dump.KernelCapture
(forward + backward of L = sum(o * do) + sum(final_state * dht)), one kcp-dump file per case, for
`kcp check`. Run by scripts/gpu_capture.sh; the table of cases is CASES below.

  python3 scripts/gpu_capture.py [--summary NAME] OUT_DIR [case ...]   capture (needs torch, triton, fla);
                                                   the table goes to OUT_DIR/NAME (capture_summary.json)
  python3 scripts/gpu_capture.py --list            the case names, one per line
  python3 scripts/gpu_capture.py --merge DIR [case ...]   DIR/summary-*.json (one process per case, as
                                                   gpu_capture.sh runs them) -> DIR/capture_summary.json
  python3 scripts/gpu_capture.py --convert DIR     *.pkl -> *.h5 (where h5py was missing)

Where the GPU machine has no h5py, each file's write_dump arguments are pickled instead and
converted on a machine with h5py (--convert). KCP_FLA_MAX_CONFIGS (default 4) keeps the first N
configurations of every Triton autotune list, to bound compile time; the kernels are FLA's own.
On Hopper with Triton < 3.7.1 FLA refuses the gated chunk_o backward (FLA#640); the guard is
bypassed here as for the goldens (docs/GOLDEN.md), and the report says so.
"""
import json
import os
import pickle
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "kcp_dump"))

T_TOTAL, CU = 256, [0, 100, 256]
DEVICE = os.environ.get("KCP_CAPTURE_DEVICE", "cuda")  # "cpu" to try the table with stand-in kernels
K = V = 64


def convert(folder):
    from kcp_dump import write_dump
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pkl"):
            with open(os.path.join(folder, name), "rb") as f:
                args = pickle.load(f)
            path = os.path.join(folder, name[:-4] + ".h5")
            write_dump(path, *args[1:])
            print(f"converted {name} -> {os.path.basename(path)}")


def limit_autotune():
    import triton
    n = int(os.environ.get("KCP_FLA_MAX_CONFIGS", "4"))
    original = triton.autotune

    def autotune(configs, key, *args, **kwargs):
        return original(list(configs)[:n], key, *args, **kwargs)

    triton.autotune = autotune
    return n


def case_inputs(torch, dtype, H, HV, kind, seed, raw_gate, varlen=True, h0=False, vk=False, l2_outside=False):
    """Inputs on the GPU: q, k [1,T,H,K]; v [1,T,HV,V]; g [1,T,HV(,K)]; beta; gate parameters; states."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    dev = DEVICE
    r = lambda *s: torch.randn(*s, generator=gen, device=dev)
    x = dict(q=r(1, T_TOTAL, H, K), k=r(1, T_TOTAL, H, K), v=r(1, T_TOTAL, HV, V))
    if l2_outside:
        x["q"], x["k"] = (torch.nn.functional.normalize(x[n], dim=-1) for n in ("q", "k"))
    for n in ("q", "k", "v"):
        x[n] = x[n].to(dtype)
    gshape = (1, T_TOTAL, HV) if kind == "gdn" else (1, T_TOTAL, HV, K)
    if raw_gate:
        x["g"] = r(*gshape).to(dtype)
    else:  # a natural-log decay in [-0.5, -0.01]
        x["g"] = (-(torch.rand(*gshape, generator=gen, device=dev) * 0.49 + 0.01)).to(
            torch.float32 if kind == "gdn" else dtype)
    if kind != "gla":
        x["beta"] = torch.rand(1, T_TOTAL, HV, generator=gen, device=dev).to(dtype)
    x["A_log"] = (torch.rand(HV, generator=gen, device=dev) * 0.5 - 1).float()
    x["dt_bias"] = (r(HV if kind == "gdn" else HV * K) * 0.2).float()
    N = len(CU) - 1 if varlen else 1
    if h0:
        s = r(N, HV, K, V).float() * 0.1
        x["initial_state"] = s.transpose(-1, -2).contiguous() if vk else s
    x["do"], x["dht"] = r(1, T_TOTAL, HV, V).to(dtype), r(N, HV, K, V).float()
    if vk:
        x["dht"] = x["dht"].transpose(-1, -2).contiguous()
    x["cu"] = torch.tensor(CU, dtype=torch.long, device=dev) if varlen else None
    return x


# name: (kernel, dtype, H, HV, input options, call keywords); "@x" names an input tensor.
CASES = {
    "kda_megatron_lb_safe_bf16": ("kda", "bfloat16", 4, 4, dict(raw_gate=True, h0=True),
                                  dict(A_log="@A_log", dt_bias="@dt_bias", use_gate_in_kernel=True, safe_gate=True,
                                       lower_bound=-5.0, use_qk_l2norm_in_kernel=True,
                                       initial_state="@initial_state", output_final_state=True, cu_seqlens="@cu")),
    "kda_gate_softplus_l2_bf16": ("kda", "bfloat16", 4, 4, dict(raw_gate=True, h0=True),
                                  dict(A_log="@A_log", dt_bias="@dt_bias", use_gate_in_kernel=True,
                                       use_qk_l2norm_in_kernel=True, initial_state="@initial_state",
                                       output_final_state=True, cu_seqlens="@cu")),
    "kda_lb_nosafe_f32": ("kda", "float32", 4, 4, dict(raw_gate=True),
                          dict(A_log="@A_log", dt_bias="@dt_bias", use_gate_in_kernel=True, lower_bound=-5.0,
                               use_qk_l2norm_in_kernel=True, cu_seqlens="@cu")),
    "kda_beta_sigmoid_negeig_f32": ("kda", "float32", 4, 4, dict(raw_gate=False, l2_outside=True, h0=True),
                                    dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                         initial_state="@initial_state", output_final_state=True, cu_seqlens="@cu")),
    "kda_gva_state_v_first_bf16": ("kda", "bfloat16", 2, 4, dict(raw_gate=False, h0=True, vk=True),
                                   dict(use_qk_l2norm_in_kernel=True, initial_state="@initial_state",
                                        output_final_state=True, state_v_first=True, cu_seqlens="@cu")),
    "gdn_gate_in_kernel_gva_bf16": ("gdn", "bfloat16", 2, 4, dict(raw_gate=True, h0=True),
                                    dict(use_gate_in_kernel=True, A_log="@A_log", dt_bias="@dt_bias",
                                         use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                         initial_state="@initial_state", output_final_state=True, cu_seqlens="@cu")),
    "gdn_megatron_train_bf16": ("gdn", "bfloat16", 4, 4, dict(raw_gate=False, l2_outside=True),
                                dict(initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     cu_seqlens="@cu")),
    "gdn_state_v_first_negeig_f32": ("gdn", "float32", 4, 4, dict(raw_gate=False, l2_outside=True, h0=True, vk=True),
                                     dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                          initial_state="@initial_state", output_final_state=True,
                                          state_v_first=True, cu_seqlens="@cu")),
    "gla_bf16": ("gla", "bfloat16", 4, 4, dict(raw_gate=False, h0=True),
                 dict(initial_state="@initial_state", output_final_state=True, cu_seqlens="@cu")),
    "gla_f32": ("gla", "float32", 4, 4, dict(raw_gate=False, h0=True),
                dict(initial_state="@initial_state", output_final_state=True, cu_seqlens="@cu")),
}


def run_case(torch, kernels, name, seed, out_dir):
    from kcp_dump import KernelCapture
    kind, dtype, H, HV, opts, call = CASES[name]
    x = case_inputs(torch, getattr(torch, dtype), H, HV, kind, seed, **opts)
    leaves = ("q", "k", "v", "g", "beta", "initial_state") + (("A_log", "dt_bias") if call.get("A_log") else ())
    for n in leaves:
        if x.get(n) is not None:
            x[n].requires_grad_(True)
    kwargs = {k: (x[v[1:]] if isinstance(v, str) and v.startswith("@") else v) for k, v in call.items()}
    args = [x["q"], x["k"], x["v"], x["g"]] + ([x["beta"]] if kind != "gla" else [])
    cap = KernelCapture(kernels[kind], os.path.join(out_dir, name + ".h5"), attrs=dict(case=name, seed=seed))
    o, ht = cap(*args, **kwargs)
    loss = (o.float() * x["do"].float()).sum()
    if ht is not None:
        loss = loss + (ht.float() * x["dht"]).sum()
    loss.backward()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    cap.flush()
    return cap.missing()


def merge(folder, names):
    """Joins the per-process tables into one; non-zero when a case failed or has no table."""
    env, cases = None, []
    for name in sorted(os.listdir(folder)):
        if name.startswith("summary-") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                part = json.load(f)
            env = env or part["env"]
            cases += part["cases"]
    seen = {c["case"] for c in cases}
    cases += [dict(case=n, status="error: no result (the process died or timed out)", seconds=0)
              for n in names if n not in seen]
    with open(os.path.join(folder, "capture_summary.json"), "w") as f:
        json.dump(dict(env=env, cases=cases), f, indent=1)
    for c in cases:
        print(f"{c['case']}: {c['status']}, {c['seconds']} s")
    return 1 if any(c["status"].startswith("error") for c in cases) else 0


def main(argv):
    if argv[:1] == ["--convert"]:
        return convert(argv[1]) or 0
    if argv[:1] == ["--list"]:
        print("\n".join(CASES))
        return 0
    if argv[:1] == ["--merge"]:
        return merge(argv[1], argv[2:] or list(CASES))
    summary = "capture_summary.json"
    if argv[:1] == ["--summary"]:
        summary, argv = argv[1], argv[2:]
    out_dir = argv[0]
    names = argv[1:] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"gpu_capture.py: unknown case {', '.join(unknown)}; the cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    import torch
    n_configs = limit_autotune()
    import fla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gla import chunk_gla
    from fla.ops.kda import chunk_kda
    import fla.ops.common.chunk_o as chunk_o
    bypass = not chunk_o.TRITON_ABOVE_3_7_1
    chunk_o.TRITON_ABOVE_3_7_1 = True  # FLA#640 guard (see the header)
    try:
        import h5py  # noqa: F401
    except ImportError:  # pickle write_dump's arguments; --convert writes the files elsewhere
        import kcp_dump.capture as capmod

        def pickle_dump(path, *args):
            with open(path[:-3] + ".pkl", "wb") as f:
                pickle.dump((path,) + args, f)

        capmod.write_dump = pickle_dump
    kernels = dict(kda=chunk_kda, gdn=chunk_gated_delta_rule, gla=chunk_gla)
    import triton
    env = dict(torch=torch.__version__, triton=triton.__version__, fla=getattr(fla, "__version__", "?"),
               device=torch.cuda.get_device_name(), autotune_configs=n_configs, fla640_guard_bypassed=bypass)
    print(json.dumps(env), flush=True)
    table, start = [], time.time()
    budget = float(os.environ.get("KCP_CAPTURE_BUDGET_S", "1e9"))  # no new case after this many seconds
    for name in names:
        t0 = time.time()
        if t0 - start > budget:
            table.append(dict(case=name, status="not run (time budget)", seconds=0))
            continue
        try:
            missing = run_case(torch, kernels, name, 1000 + list(CASES).index(name), out_dir)
            status = "captured" + (f" (missing {', '.join(missing)})" if missing else "")
        except Exception as e:
            status = f"error: {type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        table.append(dict(case=name, status=status, seconds=round(time.time() - t0, 1)))
        print(f"{name}: {status}, {time.time() - t0:.1f} s", flush=True)
        with open(os.path.join(out_dir, summary), "w") as f:  # after each case: kept on a timeout
            json.dump(dict(env=env, cases=table), f, indent=1)
    return 1 if any(c["status"].startswith("error") for c in table) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
