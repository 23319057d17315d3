#!/usr/bin/env python3
# Compares the innermost MMA loops (the k-loops) of every kernel in two object files or cubins: a loop is a
# backward branch whose body holds an HMMA / HGMMA and no other backward branch; branch targets are stripped,
# registers and order are not (ptxas re-scheduling a k-loop shows as DIFF with the same length). For changes
# outside the k-loops (epilogues, scale arithmetic) whose cost must not leak into them: the decode k-loops are
# sensitive to scheduling (docs/gemm.md). CUOBJDUMP: the cuobjdump binary (found as sass_arrive_check.py finds it).
#   python3 scripts/sass_mma_loops.py old.o new.o [kernel-substring: print the diff of its loops]
import difflib, re, subprocess, sys

from sass_arrive_check import find_cuobjdump, parse  # (this folder: the same cuobjdump listing parser)

BRANCH = re.compile(r'BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)')


def kernels(obj):
    """{kernel: [(address, instruction text)]}."""
    out = subprocess.run([CU, '-sass', obj], capture_output=True, text=True, check=True).stdout
    return {name: [(a, t) for a, t, _, _ in ins] for name, ins in parse(out).items()}


def mma_loops(ins):
    index = {a: i for i, (a, _) in enumerate(ins)}
    back = []
    for i, (a, text) in enumerate(ins):
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            back.append((index[int(m.group(1), 16)], i))
    loops = []
    for s, e in back:
        if any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in back):
            continue  # holds another loop: not innermost
        body = [t for _, t in ins[s:e + 1]]
        if any('HMMA' in t or 'HGMMA' in t for t in body):
            loops.append([re.sub(r'0x[0-9a-f]{3,6}\b', 'ADDR', t) if ('BRA' in t or 'CALL' in t) else t
                          for t in body])
    return loops


def main():
    global CU
    CU = find_cuobjdump() or 'cuobjdump'
    a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
    same = diff = 0
    for k in sorted(set(a) & set(b)):
        la, lb = mma_loops(a[k]), mma_loops(b[k])
        if not la and not lb:
            continue
        ok = la == lb
        same += ok
        diff += not ok
        print('same' if ok else 'DIFF', [len(x) for x in la], [len(x) for x in lb], k[:110])
        if len(sys.argv) > 3 and sys.argv[3] in k and not ok:
            for x, y in zip(la, lb):
                print('\n'.join(list(difflib.unified_diff(x, y, lineterm='', n=0))[:60]))
    print('kernels with MMA loops: identical', same, 'different', diff)


if __name__ == '__main__':
    main()
