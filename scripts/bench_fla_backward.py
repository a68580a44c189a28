#!/usr/bin/env python3
"""FLA's chunk_gated_delta_rule / chunk_kda / chunk_gla forward+backward (or, with --forward, forward)
timed on the GPU, next to kcp's.

Same shapes and inputs as `kcp bench --backward 1` (app/bench.cpp, app/bench_inputs.h): B = 1,
a shape var:T:H or var:T:H:N (N packed sequences of nearly equal length, `kcp bench --seqs N`: the
first T % N one token longer, FLA's cu_seqlens; the row's T column reads NxL as kcp's does),
q/k/v/do bf16 (q, k L2-normalized per row), g ~ U(-0.3, -0.001) float32 (per channel for kda),
beta ~ U(0, 1) float32 (not for gla), no initial or final state. Median of CUDA-event times after warm-up, rotating
over 3 input sets; peak device memory of one forward+backward (torch.cuda.max_memory_allocated,
inputs included). With --kcp FILE (the output of `kcp bench --backward 1`) prints one table with
both and the ratio FLA / kcp. With --kernels N, instead: FLA's kernels over N calls after the warm-up
(torch.profiler), each kernel's device time per call, largest first (to set kcp's stage times
beside FLA's). FLA from FLA_PATH (default ../../.fla, i.e. /work/main/.fla carried).
A benchmark, never a test. Used by scripts/bench_backward.sh.
"""
import argparse
import os
import sys


def equal_cu(T, seqs):
    """[0, T] cut into `seqs` nearly equal sequences, the first T % seqs one token longer (app/bench.cpp)."""
    cu, t = [0], 0
    for i in range(seqs):
        t += T // seqs + (1 if i < T % seqs else 0)
        cu.append(t)
    return cu


def make_run(variant, T, H, K, V, backward, seqs=1):
    """run(i): one forward (+ backward) of FLA's kernel on input set i % 3 (seqs > 1: packed, cu_seqlens)."""
    import torch
    torch.manual_seed(0)
    dev = "cuda"
    cu = torch.tensor(equal_cu(T, seqs), dtype=torch.long, device=dev) if seqs > 1 else None
    sets = []
    for _ in range(3):
        q = torch.nn.functional.normalize(torch.randn(1, T, H, K, device=dev), dim=-1).bfloat16()
        k = torch.nn.functional.normalize(torch.randn(1, T, H, K, device=dev), dim=-1).bfloat16()
        v = torch.randn(1, T, H, V, device=dev).bfloat16()
        gs = (1, T, H) if variant == "gdn" else (1, T, H, K)
        g = -(torch.rand(gs, device=dev) * 0.299 + 0.001)
        beta = torch.rand(1, T, H, device=dev)
        do = torch.randn(1, T, H, V, device=dev).bfloat16()
        for t in (q, k, v, g, beta):
            t.requires_grad_(backward)
        sets.append((q, k, v, g, beta, do))
    if variant == "gdn":
        import fla.ops.common.chunk_o as m
        m.TRITON_ABOVE_3_7_1 = True  # FLA's gdn backward on Triton 3.6 (see the issue)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    elif variant == "kda":
        from fla.ops.kda import chunk_kda as fn
    else:
        from fla.ops.gla import chunk_gla

        def fn(q, k, v, g, beta, output_final_state, cu_seqlens=None):  # no beta in GLA
            return chunk_gla(q, k, v, g, output_final_state=output_final_state, cu_seqlens=cu_seqlens)

    def run(i):
        q, k, v, g, beta, do = sets[i % 3]
        o, _ = fn(q, k, v, g, beta, output_final_state=False, cu_seqlens=cu)
        if backward:
            torch.autograd.backward(o, do)

    return run


def fla_time(variant, T, H, K, V, repeat, warmup, backward=True, seqs=1):
    import torch
    run = make_run(variant, T, H, K, V, backward, seqs)
    for i in range(warmup):
        run(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    run(0)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20
    ms = []
    for i in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(i)
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    ms.sort()
    return ms[len(ms) // 2], peak


def fla_kernels(variant, T, H, K, V, calls, backward=True, seqs=1):
    """(kernel name, device ms per call, launches per call) over `calls` calls, largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    run = make_run(variant, T, H, K, V, backward, seqs)
    for i in range(3):
        run(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            run(i)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append((e.key, us / 1000 / calls, e.count / calls))
    return sorted(rows, key=lambda r: -r[1])


def kcp_rows(path):
    rows = {}
    if not path or not os.path.exists(path):
        return rows
    for line in open(path):
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(f) >= 5 and f[0] in ("gdn", "kda", "gla") and f[1].replace("x", "").isdigit():
            try:  # median ms, and MiB held (column 12) where this kcp prints it; T as printed (NxL packed)
                mib = f[11] if len(f) > 11 and f[11].isdigit() else "-"
                rows[(f[0], f[1], int(f[2]))] = (float(f[3]), mib)
            except ValueError:
                pass
    return rows


def parse_shape(s):
    """var:T:H[:N] -> (var, T, H, N, the T column as kcp bench prints it)."""
    f = s.split(":")
    var, T, H, seqs = f[0], int(f[1]), int(f[2]), int(f[3]) if len(f) > 3 else 1
    return var, T, H, seqs, (f"{seqs}x{T // seqs}" if seqs > 1 else str(T))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="gdn:8192:16,gdn:32768:16,kda:8192:16")
    ap.add_argument("--kcp", default="")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--forward", action="store_true", help="time the forward alone (no autograd)")
    ap.add_argument("--kernels", type=int, default=0, help="FLA's kernels over this many calls instead")
    a = ap.parse_args()
    what = "fwd" if a.forward else "fwd+bwd"
    sys.path.insert(0, os.environ.get("FLA_PATH", os.path.join(os.path.dirname(__file__), "../../../.fla")))
    if a.kernels:
        print(f"| op | T | H | FLA kernel ({what}) | ms per call | launches per call |")
        print("|---|---|---|---|---|---|")
        for s in a.shapes.split(","):
            var, T, H, seqs, label = parse_shape(s)
            for name, ms, n in fla_kernels(var, T, H, 128, 128, a.kernels, backward=not a.forward, seqs=seqs):
                print(f"| {var} | {label} | {H} | {name[:90]} | {ms:.3f} | {n:g} |", flush=True)
        return
    kcp = kcp_rows(a.kcp)
    print(f"| op | T | H | FLA {what} ms | FLA peak MiB | kcp {what} ms | kcp MiB held | FLA / kcp |")
    print("|---|---|---|---|---|---|---|---|")
    for s in a.shapes.split(","):
        var, T, H, seqs, label = parse_shape(s)
        ms, peak = fla_time(var, T, H, 128, 128, a.repeat, a.warmup, backward=not a.forward, seqs=seqs)
        mine, mib = kcp.get((var, label, H), (None, "-"))
        ratio = f"{ms / mine:.2f}" if mine else "-"
        print(f"| {var} | {label} | {H} | {ms:.3f} | {peak:.0f} | {mine if mine else '-'} | {mib} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
