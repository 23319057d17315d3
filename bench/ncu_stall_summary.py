#!/usr/bin/env python3
# Where a whole kernel's warp-stall samples go, from Nsight Compute's source page (`ncu --import R.ncu-rep --page
# source --print-source sass --csv > R.source.csv`, a `--set full` report): per kernel, the share of all samples by
# stall reason, by SASS opcode, and the instructions with the most samples (with the reasons that make up > 15% of
# each). bench/ncu_kloop_stalls.py looks at one hot loop (the decode k-loops); this one at everything, as for the
# prefill tile kernels, whose warps (producer, consumers, epilogue) each loop differently.
#   python3 bench/ncu_stall_summary.py R.source.csv [top]
import collections
import csv
import sys

from ncu_kloop_stalls import kernels  # (the same page parser: one table per kernel, repeats dropped)


def num(x):
    try:
        return int(x.replace(',', ''))
    except ValueError:
        return 0


def main():
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    for name_line, hdr, rows in kernels(sys.argv[1]):
        name = next(csv.reader([name_line]))[1]
        rows = [r for r in rows if len(r) == len(hdr)]
        reasons = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
        col = {h: hdr.index(h) for h in reasons + ['Warp Stall Sampling (All Samples)', 'Source']}
        by_reason, by_op, per = collections.Counter(), collections.Counter(), []
        total = 0
        for r in rows:
            s = num(r[col['Warp Stall Sampling (All Samples)']])
            total += s
            for h in reasons:
                by_reason[h] += num(r[col[h]])
            src = r[col['Source']].strip()
            words = src.split()
            op = (words[1] if words and words[0].startswith('@') and len(words) > 1 else (words[0] if words else '?'))
            by_op[op.split('.')[0]] += s
            per.append((s, src, {h[6:]: num(r[col[h]]) for h in reasons if num(r[col[h]]) > 0.15 * s > 0}))
        print(name[:160])
        print(f'  samples {total}')
        if not total:
            continue
        print('  by reason: ' + ', '.join(f'{h[6:]} {v / total:.1%}' for h, v in by_reason.most_common(10)))
        print('  by opcode: ' + ', '.join(f'{k} {v / total:.1%}' for k, v in by_op.most_common(14)))
        per.sort(key=lambda x: -x[0])
        for s, src, reasons_of in per[:top]:
            print(f'   {s / total:6.2%}  {src[:72]:72s} {reasons_of if reasons_of else ""}')


if __name__ == '__main__':
    main()
