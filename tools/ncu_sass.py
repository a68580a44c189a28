#!/usr/bin/env python3
"""Summarize one kernel's SASS-level Nsight Compute csv (scripts/gpu_ab.sh writes them:
`ncu -i REP --page source --csv --print-source sass`): the instruction mix (share of executed warp
instructions and of stall samples per opcode) and the hot straight-line segments (consecutive
instructions with the same execution count), with the memory / tensor / barrier operations in each.
The segments locate a kernel's phases without -lineinfo; docs/BENCHMARKS.md (ninth session) used it.
  tools/ncu_sass.py hv_gdn.sass.csv.gz [--top 30] [--min-share 0.4]
"""
import argparse
import collections
import csv
import gzip

KEY_OPS = ('HMMA', 'LDSM', 'LDS', 'STS', 'LDG', 'STG', 'LDGSTS', 'MUFU', 'BAR', 'SHFL', 'DEPBAR', 'FFMA', 'WGMMA')


def read(path):
    opener = gzip.open if path.endswith('.gz') else open
    rows = list(csv.reader(opener(path, 'rt', errors='replace')))
    head = next(i for i, r in enumerate(rows) if 'Instructions Executed' in r)
    h = rows[head]
    ix = {c: i for i, c in enumerate(h)}
    stalls = [c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
    seq = []
    for r in rows[head + 1:]:
        if len(r) < len(h):
            continue
        src = r[ix['Source']].strip()
        words = src.split()
        op = (words[1] if words and words[0].startswith('@') and len(words) > 1 else (words[0] if words else '')).split('.')[0]
        n = int(r[ix['Instructions Executed']] or 0)
        s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
        st = {c[6:]: int(r[ix[c]] or 0) for c in stalls}
        seq.append((op, src, n, s, st))
    return seq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('csv')
    ap.add_argument('--top', type=int, default=25)
    ap.add_argument('--min-share', type=float, default=0.4, help='segments with at least this %% of instructions or samples')
    a = ap.parse_args()
    seq = read(a.csv)
    tot = sum(x[2] for x in seq) or 1
    stot = sum(x[3] for x in seq) or 1
    ops, samp = collections.Counter(), collections.Counter()
    for op, _, n, s, _ in seq:
        ops[op] += n
        samp[op] += s
    print(f'warp instructions {tot}, stall samples {stot}')
    for op, n in ops.most_common(a.top):
        print(f'  {op:<10} {100 * n / tot:6.2f}% instructions {100 * samp[op] / stot:6.2f}% samples')
    print('segments (index range, executions per instruction, instructions, shares, key operations, top stalls):')
    start = 0
    for i in range(1, len(seq) + 1):
        if i < len(seq) and seq[i][2] == seq[start][2]:
            continue
        seg = seq[start:i]
        n, cnt = seg[0][2], len(seg)
        s = sum(x[3] for x in seg)
        share, sshare = 100 * n * cnt / tot, 100 * s / stot
        if share >= a.min_share or sshare >= 2 * a.min_share:
            keys = collections.Counter(x[0] for x in seg if x[0] in KEY_OPS)
            st = collections.Counter()
            for x in seg:
                st.update(x[4])
            top = ', '.join(f'{k} {100 * v / stot:.1f}%' for k, v in st.most_common(2) if v)
            print(f'  {start:5d}-{i - 1:5d} x{n:<8d} {cnt:4d} instr {share:5.1f}% samples {sshare:5.1f}%  {dict(keys)}  [{top}]')
        start = i


if __name__ == '__main__':
    main()
