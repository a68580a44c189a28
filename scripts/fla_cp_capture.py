"""FLA's own context parallelism (KCP: fla.ops.cp.build_cp_context + chunk_kda / chunk_gated_delta_rule
with cp_context) judged by kcp against the float64 oracle (issue 14 item 3; docs/CP.md "FLA's own CP").

Every rank builds the same seeded global packed batch (sequences of mixed lengths, B = 1, q/k [1,T,H,K],
v/do [1,T,HV,V], g, beta, A_log, dt_bias), takes FLA's equal contiguous part [r*T/P, (r+1)*T/P), runs
forward + backward of L = sum(o * do) through FLA with the cp_context, and captures its own call with
kcp_dump.KernelCapture (global cu_seqlens with scope "global", token_offset, FLA's context fields), plus
the per-rank transitions FLA exchanges: /debug/cp_transition_fwd = (S_ext | M) and cp_transition_bwd =
(dS_ext | M^T), each [HV, K, V+K] float32 as FLA all-gathers them (taken at its all_gather). Then
`kcp assemble` rebuilds the global call and `kcp check` judges every tensor against FLA's thresholds;
`kcp check` of the rank files judges what each rank holds by itself: FLA's transitions against the
oracle's transition of the same local sequence (rows debug/cp_transition_fwd.S/.M, cp_transition_bwd.dS/.MT;
validation/cp_transition_check.h), and o and gradients of ranks whose sequences start / end there.

  python3 scripts/fla_cp_capture.py --nproc 2 --backend gloo --op kda --dtype bf16 --out DIR --kcp build/kcp
  torchrun --nproc_per_node 4 scripts/fla_cp_capture.py --backend nccl --op gdn --out DIR --kcp build/kcp
  python3 scripts/fla_cp_capture.py --judge DIR --kcp build/kcp     (assemble + check files made elsewhere)

Backends: nccl, one GPU per rank (device = local rank). gloo: ranks may share one GPU; torch's gloo
implements all_gather_into_tensor by splitting the [P, ...] output into [1, ...] pieces it then requires
to match the input's shape, so FLA's exchange is replaced, under gloo only, by a host-staged all_gather
(--gloo-staging auto|on; off leaves FLA's call as is, to see what gloo does with it). FLA's CP refuses
initial_state / output_final_state (--h0 shows the refusal). NCCL_NVLS_ENABLE=0 is set. Where h5py is
missing the rank files are pickled and --judge converts them. KCP_FLA_STANDIN=module replaces FLA by a
module with chunk_kda, chunk_gated_delta_rule and build_cp_context (the CPU test,
tests/tools/test_fla_cp_capture.py).
"""
import argparse
import importlib
import json
import os
import pickle
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "kcp_dump"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
DEFAULT_SEQLENS = "1000,67,512,193,1,700,290,1333"  # 4096 tokens: cuts mid-sequence at P = 2, 4, 8


def parse_args(argv):
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    a.add_argument("--op", choices=("gdn", "kda"), default="kda")
    a.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    a.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    a.add_argument("--nproc", type=int, default=0, help="spawn this many ranks (else: torchrun's, or 1)")
    a.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the stand-in test only")
    a.add_argument("--seqlens", default=DEFAULT_SEQLENS, help="global sequence lengths; the last grows to P | T")
    a.add_argument("--H", type=int, default=4)
    a.add_argument("--HV", type=int, default=0, help="value heads (default H; H < HV is GVA)")
    a.add_argument("--K", type=int, default=128)
    a.add_argument("--V", type=int, default=128)
    a.add_argument("--seed", type=int, default=14)
    a.add_argument("--h0", action="store_true", help="pass initial_state / output_final_state (FLA refuses)")
    a.add_argument("--gloo-staging", choices=("auto", "on", "off"), default="auto")
    a.add_argument("--out", default="fla_cp")
    a.add_argument("--kcp", default="", help="kcp binary: assemble + check after the run")
    a.add_argument("--judge", default="", help="only assemble + check the rank files in this folder")
    args = a.parse_args(argv)
    args.HV = args.HV or args.H
    return args


def load_fla():
    """(chunk_kda, chunk_gated_delta_rule, build_cp_context, module holding FLA's CP exchange or None)."""
    standin = os.environ.get("KCP_FLA_STANDIN")
    if standin:
        m = importlib.import_module(standin)  # its exchange, when it has one, is tapped like FLA's
        return m.chunk_kda, m.chunk_gated_delta_rule, m.build_cp_context, \
            (m if hasattr(m, "all_gather_into_tensor") else None)
    from gpu_capture import limit_autotune  # noqa: first N autotune configs (KCP_FLA_MAX_CONFIGS)
    limit_autotune()
    import fla.ops.common.chunk_o as chunk_o
    chunk_o.TRITON_ABOVE_3_7_1 = True  # FLA#640's Hopper guard on the gated backward, as docs/GOLDEN.md
    import fla.ops.cp.chunk_delta_h as cdh
    from fla.ops.cp import build_cp_context
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda
    return chunk_kda, chunk_gated_delta_rule, build_cp_context, cdh


def seqlens_for(spec, P):
    """The global lengths, the last grown so that P divides T (FLA's CP needs it)."""
    lens = [int(x) for x in spec.split(",") if x.strip()]
    lens[-1] += (-sum(lens)) % P
    return lens


def global_batch(torch, args, lens, dtype):
    """The same seeded global inputs on every rank (host generator), as FLA's production calls take them:
    kda: raw gate g [1,T,HV,K] with A_log, dt_bias, lower bound -5, safe_gate; gdn: log decay g
    [1,T,HV] float32; both: q/k l2-normalised in the kernel, beta in (0, 1), do [1,T,HV,V]."""
    gen = torch.Generator().manual_seed(args.seed)
    T, H, HV, K, V = sum(lens), args.H, args.HV, args.K, args.V
    r = lambda *s: torch.randn(*s, generator=gen)
    x = dict(q=r(1, T, H, K).to(dtype), k=r(1, T, H, K).to(dtype), v=r(1, T, HV, V).to(dtype))
    if args.op == "kda":
        x["g"] = r(1, T, HV, K).to(dtype)
        x["A_log"] = (torch.rand(HV, generator=gen) * 0.5 - 1).float()
        x["dt_bias"] = (r(HV * K) * 0.2).float()
    else:
        x["g"] = -(torch.rand(1, T, HV, generator=gen) * 0.49 + 0.01)
    x["beta"] = torch.rand(1, T, HV, generator=gen).to(dtype)
    x["do"] = r(1, T, HV, V).to(dtype)
    x["cu"] = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.long)
    return x


def call_keywords(args):
    if args.op == "kda":
        return dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, use_qk_l2norm_in_kernel=True)
    return dict(use_qk_l2norm_in_kernel=True)


class ExchangeTap:
    """Wraps FLA's all_gather_into_tensor in fla.ops.cp.chunk_delta_h: records this rank's packed
    transition (the caller names the direction), and under gloo stages the exchange through the host."""

    def __init__(self, torch, dist, module, staged):
        self.torch, self.dist, self.module, self.staged = torch, dist, module, staged
        self.original, self.seen, self.on_record = module.all_gather_into_tensor, {}, None
        module.all_gather_into_tensor = self

    def __call__(self, inp, out=None, group=None, async_op=False):
        caller = sys._getframe(1).f_code.co_name
        key = "cp_transition_bwd" if "bwd" in caller else "cp_transition_fwd"
        self.seen[key] = inp.detach().clone()
        if self.on_record:  # into the capture now: it writes its file as soon as the gradients arrived
            self.on_record(key, self.seen[key])
        if not self.staged:
            return self.original(inp, out=out, group=group, async_op=async_op)
        P = self.dist.get_world_size(group=group)
        host = inp.detach().cpu().contiguous()
        parts = [self.torch.empty_like(host) for _ in range(P)]
        self.dist.all_gather(parts, host, group=group)
        gathered = self.torch.stack(parts).to(inp.device)
        if out is None:
            return gathered, None
        out.copy_(gathered)
        return out, None


def pickle_writes():
    """Where h5py is missing: KernelCapture's write_dump pickles its arguments (--judge converts)."""
    try:
        import h5py  # noqa: F401
        return False
    except ImportError:
        import kcp_dump.capture as capmod

        def pickle_dump(path, *a, **kw):
            with open(path[:-3] + ".pkl", "wb") as f:
                pickle.dump((path, a, kw), f)

        capmod.write_dump = pickle_dump
        return True


def init_rank(torch, dist, args, rank, world):
    """The process group and this rank's device (nccl: one GPU per rank; gloo: ranks may share)."""
    if args.device == "cuda":
        n = torch.cuda.device_count()
        local = int(os.environ.get("LOCAL_RANK", rank))
        if args.backend == "nccl" and local >= n:
            raise SystemExit(f"fla_cp_capture: rank {rank}: --backend nccl needs one GPU per rank, this host has {n}"
                             f" (use --backend gloo to share one GPU)")
        device = torch.device("cuda", local % n)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    return device


def run_rank(rank, world, args):
    """One rank: FLA's CP call on its part, captured; forward + backward; its file and summary written."""
    import torch
    import torch.distributed as dist
    from kcp_dump import KernelCapture
    device = init_rank(torch, dist, args, rank, world)
    chunk_kda, chunk_gdn, build_cp_context, cdh = load_fla()
    staged = args.backend == "gloo" and args.gloo_staging != "off" and args.device == "cuda"
    tap = ExchangeTap(torch, dist, cdh, staged) if cdh is not None else None
    pickled = pickle_writes()
    lens = seqlens_for(args.seqlens, world)
    x = global_batch(torch, args, lens, getattr(torch, DTYPES[args.dtype]))
    T = int(x["cu"][-1])
    lo, hi = rank * T // world, (rank + 1) * T // world
    ctx = build_cp_context(x["cu"].to(device), group=dist.group.WORLD, cu_seqlens_cpu=x["cu"])
    local = {n: x[n][:, lo:hi].to(device).contiguous().requires_grad_(n != "do")
             for n in ("q", "k", "v", "g", "beta", "do")}
    params = {n: x[n].to(device).requires_grad_() for n in ("A_log", "dt_bias") if n in x}
    path = os.path.join(args.out, f"{args.op}_L0_it0_mb0_tp0of1_cp{rank}of{world}.h5")
    cap = KernelCapture(chunk_kda if args.op == "kda" else chunk_gdn, path, cp_global_cu_seqlens=x["cu"],
                        attrs=dict(case=f"fla_cp_{args.op}_{args.dtype}_P{world}_{args.backend}", seed=args.seed,
                                   cp_size=world, cp_rank=rank, global_rank=rank))
    if tap:
        tap.on_record = cap.add_debug
    kw = dict(call_keywords(args), cp_context=ctx, **params)
    if args.h0:
        N = len(ctx.cu_seqlens) - 1
        kw.update(initial_state=torch.zeros(N, args.HV, args.K, args.V, device=device), output_final_state=True)
    status = "captured"
    try:
        out = cap(local["q"], local["k"], local["v"], local["g"], local["beta"], **kw)
        o = out[0] if isinstance(out, (tuple, list)) else out
        (o.float() * local["do"].float()).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        cap.flush()
        status += f" (missing {', '.join(cap.missing())})" if cap.missing() else ""
    except AssertionError as e:  # FLA's own refusals (initial_state under CP)
        status = f"refused by FLA: {e}"
    summary = dict(rank=rank, world=world, backend=args.backend, tokens=[lo, hi], seqlens=lens, status=status,
                   local_cu_seqlens=[int(c) for c in ctx.cu_seqlens.tolist()], pickled=pickled,
                   transitions=sorted(tap.seen) if tap else [], gloo_staged=staged,
                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                   torch=torch.__version__)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"rank {rank}/{world}: tokens [{lo}, {hi}), local cu_seqlens {summary['local_cu_seqlens']}: {status}",
          flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if status.startswith("captured") else 3


def _spawned(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    code = run_rank(rank, world, args)
    if code:
        raise SystemExit(code)


def convert(folder):
    from kcp_dump import write_dump
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pkl"):
            with open(os.path.join(folder, name), "rb") as f:
                path, a, kw = pickle.load(f)
            write_dump(os.path.join(folder, os.path.basename(path)), *a, **kw)
            print(f"converted {name} -> {os.path.basename(path)}")


def judge(folder, kcp):
    """kcp assemble of the rank files, kcp check of the global file and of the rank files (FLA's transitions
    against the oracle's, rows debug/cp_transition_*, and the tensors a rank holds by itself); a per-tensor
    table; non-zero when a tensor of either check failed."""
    convert(folder)
    shards = sorted(os.path.join(folder, n) for n in os.listdir(folder) if "_cp" in n and n.endswith(".h5"))
    if not shards:
        print(f"fla_cp_capture: no rank files in {folder}")
        return 2
    glob = os.path.join(folder, "global.h5")
    steps = [[kcp, "assemble", "--out", glob] + shards,
             [kcp, "check", "--json", os.path.join(folder, "check_global.json"), glob],
             [kcp, "check", "--json", os.path.join(folder, "check_ranks.json")] + shards]
    rc = 0
    for i, cmd in enumerate(steps):
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(f"$ {' '.join(os.path.relpath(c) if os.path.exists(c) else c for c in cmd)}  (exit {r.returncode})")
        print(r.stdout + r.stderr, flush=True)
        if r.returncode and i == 0:
            return r.returncode
        if i == 2 and r.returncode == 3:  # nothing judged in the rank files: everything there needs other ranks
            continue
        rc = rc or r.returncode
    return rc


def main(argv):
    args = parse_args(argv)
    if args.judge:
        return judge(args.judge, args.kcp or "kcp")
    os.makedirs(args.out, exist_ok=True)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun / torch.distributed.run
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        code = run_rank(rank, world, args)
        return judge(args.out, args.kcp) if (args.kcp and rank == 0 and not code) else code
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = args.nproc or 1
    try:
        mp.spawn(_spawned, args=(world, args, port), nprocs=world, join=True)
    except mp.ProcessExitedException as e:
        print(f"fla_cp_capture: a rank failed: {e}", file=sys.stderr)
        return e.exit_code if e.exit_code and e.exit_code > 0 else 1
    return judge(args.out, args.kcp) if args.kcp else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
