#!/usr/bin/env python3
"""Attribute one kernel's ncu SASS counters to source lines: joins the per-instruction rows of
`ncu --page source --print-source sass --csv` (what tools/ncu_sass.py reads) with `nvdisasm -g -c` of
the same build compiled with -lineinfo, instruction by instruction (the two list a function's SASS in
the same order), and prints the share of executed warp instructions and of stall samples per source
line, with each line's top opcodes; --range A-B lists the lines of one index segment of ncu_sass.py.
How to get the inputs (docs/CUDA.md "Profiling"): configure a second build with
-DCMAKE_CUDA_FLAGS=-lineinfo, profile its kcp on the GPU machine, and there run
`cuobjdump -xelf all <the kernel's .cu.o>` and `nvdisasm -g -c` on each cubin (this machine has no
cuobjdump or nvdisasm).
  tools/ncu_sass_lines.py dis.txt.gz kernel.csv.gz --function bwd_hv_kernelILi128ELb0ELb1ELb0E [--top 40]
Covered by tests/tools/test_ncu_profile_tools.py (a synthetic kernel; no GPU).
"""
import argparse
import collections
import gzip
import re

import ncu_sass


def disassembly(path, fragment):
    """The instructions (text, 'file:line') of the first function whose mangled name contains fragment."""
    opener = gzip.open if path.endswith('.gz') else open
    lines = opener(path, 'rt', errors='replace').read().split('\n')
    start = next((i for i, l in enumerate(lines) if fragment in l and l.endswith(':') and not l.startswith('.')), None)
    if start is None:
        raise SystemExit(f'no function containing {fragment!r} in {path}')
    cur, out = '?', []
    for l in lines[start + 1:]:
        if l.startswith('\t.section') or l.startswith('.text.'):
            break
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', l)
        if m:
            cur = m.group(1).split('/')[-1] + ':' + m.group(2)
            continue
        m = re.match(r'\s*/\*[0-9a-f]{4,}\*/\s+(.*);', l)
        if m:
            out.append((m.group(1).strip(), cur))
    return lines[start][:-1], out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('dis')
    ap.add_argument('csv')
    ap.add_argument('--function', required=True, help='a fragment of the mangled kernel name')
    ap.add_argument('--top', type=int, default=40)
    ap.add_argument('--range', help='A-B: the source lines of instructions A..B (ncu_sass.py segment indices)')
    a = ap.parse_args()
    name, ins = disassembly(a.dis, a.function)
    seq = ncu_sass.read(a.csv)
    print(f'{name}: {len(ins)} instructions disassembled, {len(seq)} profiled')
    if len(ins) != len(seq) or any(i[0].split()[0] != s[1].split()[0] for i, s in zip(ins, seq) if i[0] and s[1]):
        raise SystemExit('the disassembly and the profile list different code: another build or another function')
    tot = sum(x[2] for x in seq) or 1
    stot = sum(x[3] for x in seq) or 1
    lo, hi = map(int, a.range.split('-')) if a.range else (0, len(seq) - 1)
    by = collections.defaultdict(lambda: [0, 0, 0, collections.Counter()])
    for (text, src), (op, _, n, s, _) in list(zip(ins, seq))[lo:hi + 1]:
        b = by[src]
        b[0] += n
        b[1] += s
        b[2] += 1
        b[3][op] += n
    for src, (n, s, count, ops) in sorted(by.items(), key=lambda kv: -kv[1][0])[:a.top]:
        mix = ' '.join(f'{o}:{100 * c / n:.0f}' for o, c in ops.most_common(5)) if n else ''
        print(f'{100 * n / tot:5.1f}% instr {100 * s / stot:5.1f}% samples {count:4d} SASS  {src:40s} {mix}')


if __name__ == '__main__':
    main()
