#!/usr/bin/env python3
"""tools/ncu_sass.py and tools/ncu_sass_lines.py on a small synthetic kernel (label tools; no GPU): a
three-instruction disassembly with two source lines and ncu csv rows for it. Checks the per-line shares
of executed instructions and stall samples, the --range cut, and that a profile of other code (one
instruction more) is refused rather than joined wrongly."""
import os
import subprocess
import sys
import tempfile

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools')

DIS = '''\t.section\t.text._Z3fooILi1EEvv,"ax",@progbits
.text._Z3fooILi1EEvv:
_Z3fooILi1EEvv:
\t//## File "/src/cuda/a.cu", line 10
        /*0000*/                   IMAD R1, R2, R3, R4 ;
        /*0010*/                   LDS R5, [R6] ;
\t//## File "/src/cuda/b.cuh", line 20
        /*0020*/                   HMMA.16816.F32 R8, R10, R12, R8 ;
\t.section\t.text._Z3barv,"ax",@progbits
_Z3barv:
        /*0000*/                   EXIT ;
'''
HEAD = '"Address","Source","Instructions Executed","Warp Stall Sampling (All Samples)","stall_long_sb"\n'
ROWS = ['"0","IMAD R1, R2, R3, R4","100","5","1"\n', '"16","LDS R5, [R6]","100","15","10"\n',
        '"32","HMMA.16816.F32 R8, R10, R12, R8","100","30","0"\n']


def run(args):
    return subprocess.run([sys.executable, os.path.join(TOOLS, 'ncu_sass_lines.py')] + args,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=TOOLS))


def main():
    failures = []
    with tempfile.TemporaryDirectory() as d:
        dis, csv, bad = (os.path.join(d, n) for n in ('dis.txt', 'k.csv', 'bad.csv'))
        open(dis, 'w').write(DIS)
        open(csv, 'w').write(HEAD + ''.join(ROWS))
        open(bad, 'w').write(HEAD + ''.join(ROWS) + ROWS[0])
        r = run([dis, csv, '--function', 'fooILi1E'])
        lines = {l.split()[6]: l.split() for l in r.stdout.splitlines()[1:]}
        if r.returncode != 0 or set(lines) != {'a.cu:10', 'b.cuh:20'}:
            failures.append(f'plain run: rc {r.returncode}, {r.stdout!r} {r.stderr!r}')
        else:
            # a.cu:10 holds 200 of 300 executions and 20 of 50 samples; b.cuh:20 the rest
            if lines['a.cu:10'][0] != '66.7%' or lines['a.cu:10'][2] != '40.0%' or lines['b.cuh:20'][2] != '60.0%':
                failures.append(f'shares: {lines}')
        r = run([dis, csv, '--function', 'fooILi1E', '--range', '2-2'])
        if r.returncode != 0 or 'b.cuh:20' not in r.stdout or 'a.cu:10' in r.stdout:
            failures.append(f'--range 2-2: {r.stdout!r}')
        r = run([dis, bad, '--function', 'fooILi1E'])
        if r.returncode == 0 or 'different code' not in r.stderr:
            failures.append(f'a profile of other code was not refused: rc {r.returncode} {r.stderr!r}')
        r = run([dis, csv, '--function', 'nosuchkernel'])
        if r.returncode == 0 or 'no function' not in r.stderr:
            failures.append(f'an unknown function was not refused: {r.stderr!r}')
    for f in failures:
        print('FAIL', f)
    print('test_ncu_profile_tools:', 'FAIL' if failures else 'pass')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
