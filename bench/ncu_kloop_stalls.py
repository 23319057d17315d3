#!/usr/bin/env python3
# Where a kernel's hot loop spends its warp-stall samples, from Nsight Compute's source page
# (`ncu --import R.ncu-rep --page source --print-source sass --csv > R.source.csv`, a `--set full` report).
# Per kernel of the file: the "hot" instructions (executed at least half as often as the most executed one: a
# k-loop's body), their stall samples by reason (`selected` = the warp was issuing), and all samples of the
# kernel. Used for the T = 1 k-loop's bound (docs/gemm.md, "The rolled k-loop pipelined by one k-tile in
# registers"; bench/results/a1c6c93-ws-rolled-pipelined-ab-h100/ncu, 3fcc904-resident-row-early-copy-ab-h100/ncu).
#   python3 bench/ncu_kloop_stalls.py base.source.csv new.source.csv
import collections
import csv
import sys

HOT_SHARE = 0.5  # of the most executed instruction's count


def kernels(path):
    """(kernel name, header, rows) per kernel of a source-page CSV (each starts with a "Kernel Name" line)."""
    blocks, cur = [], None
    for line in open(path).read().split('\n'):
        if line.startswith('"Kernel Name"'):
            cur = [line]
            blocks.append(cur)
        elif cur is not None and line.strip():
            cur.append(line)
    seen = set()
    for b in blocks:
        if b[0] in seen:  # (the page repeats a kernel's table; report each once)
            continue
        seen.add(b[0])
        rows = list(csv.reader(b[1:]))
        yield b[0], rows[0], rows[1:]


def main(paths):
    for path in paths:
        for name, head, rows in kernels(path):
            stall_cols = [i for i, c in enumerate(head) if c.startswith('stall_') and 'Not Issued' not in c]
            executed = head.index('Instructions Executed')
            most = max(int(r[executed] or 0) for r in rows)
            hot = [r for r in rows if int(r[executed] or 0) >= most * HOT_SHARE]
            by_reason = collections.Counter()
            for r in hot:
                for i in stall_cols:
                    by_reason[head[i][len('stall_'):]] += int(r[i] or 0)
            everything = sum(int(r[i] or 0) for r in rows for i in stall_cols)
            short = name.split('<', 1)[1][:60] if '<' in name else name[:60]
            print(f'{path.split("/")[-1]} {short}')
            print(f'  hot instructions {len(hot)} (executed {most} times each), samples hot {sum(by_reason.values())},'
                  f' all {everything}')
            print('  hot: ' + ', '.join(f'{k}={v}' for k, v in by_reason.most_common(9)))


if __name__ == '__main__':
    main(sys.argv[1:])
