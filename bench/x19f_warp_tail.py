#!/usr/bin/env python3
# Reads x19f's per-warp dump (NVFP4MOE_X19_DUMP: one line per warp of the warp-streaming GEMMs, its phases' stamps in
# ns from the forward's routing launch; bench/experiments/protocol-and-x19f-call.sh) and says which warps end a
# launch last. A warp's "scheduler" is (SM, warp index % 4); its load is the number of warps on that scheduler that
# ran a piece (stamped P4). Per preset, launch kind and load: warps, mean first k-tile (P4), k-loop end (P5) and exit
# (P7) relative to the launch's median P5 (means over forwards), and who the last 5% of warps by P5 are.
#   python3 bench/x19f_warp_tail.py DUMP        python3 bench/x19f_warp_tail.py --selftest
import collections, statistics, sys


def analyse(lines, out=sys.stdout):
    # (preset, mode, T, replay, forward, kind, launch) -> list of (block, smid, warp, stamps)
    launches = collections.defaultdict(list)
    for line in lines:
        if line.startswith('#') or not line.strip():
            continue
        f = line.split()
        key = (f[0], f[1], int(f[2]), int(f[3]), int(f[4]), f[5], int(f[6]))
        launches[key].append((int(f[7]), int(f[8]), int(f[9]), [int(x) for x in f[10:]]))
    # (preset, kind, launch) -> load -> lists of (P4, P5, P7) relative to the launch's median P5
    by_load = collections.defaultdict(lambda: collections.defaultdict(list))
    tails = collections.defaultdict(list)
    last = collections.defaultdict(collections.Counter)
    last_q = collections.defaultdict(collections.Counter)
    per_sm = collections.defaultdict(collections.Counter)
    for key, warps in launches.items():
        ran = [w for w in warps if w[3][4] >= 0 and w[3][5] >= 0]
        if not ran:
            continue
        load = collections.Counter((sm, q % 4) for _, sm, q, _ in ran)
        sm_warps = collections.Counter(sm for _, sm, _, _ in ran)
        med = statistics.median(w[3][5] for w in ran)
        g = (key[0], key[5], key[6])
        per_sm[g].update(sm_warps.values())
        for b, sm, q, t in ran:
            by_load[g][load[(sm, q % 4)]].append((t[4] - med, t[5] - med, (t[7] - med) if t[7] >= 0 else float('nan')))
        tails[g].append(max(w[3][5] for w in ran) - med)
        ordered = sorted(ran, key=lambda w: w[3][5])
        for b, sm, q, t in ordered[len(ordered) - max(1, len(ordered) // 20):]:
            last[g][load[(sm, q % 4)]] += 1
            last_q[g][q] += 1
    for g in sorted(by_load):
        n_launches = len(tails[g])
        print(f'{g[0]} {g[1]}#{g[2]}: {n_launches} launches; piece warps an SM (over launches): '
              + ', '.join(f'{k}: {v}' for k, v in sorted(per_sm[g].items()))
              + f'; last warp past the median P5: {statistics.mean(tails[g]) / 1e3:.2f} us (mean)', file=out)
        print(f'  {"load":>4} {"warps":>7} {"P4-med":>8} {"P5-med":>8} {"P7-med":>8}  (us, means; load = piece warps '
              f'on the warp\'s scheduler)', file=out)
        for load in sorted(by_load[g]):
            v = by_load[g][load]
            print(f'  {load:>4} {len(v) / n_launches:>7.1f} {statistics.mean(x[0] for x in v) / 1e3:>8.2f} '
                  f'{statistics.mean(x[1] for x in v) / 1e3:>8.2f} {statistics.mean(x[2] for x in v) / 1e3:>8.2f}',
                  file=out)
        tot = sum(last[g].values())
        print('  the last 5% by P5, by load: ' + ', '.join(f'{k}: {v / tot:.2f}' for k, v in sorted(last[g].items()))
              + '; by warp index: ' + ', '.join(f'{k}: {v / tot:.2f}' for k, v in sorted(last_q[g].items())),
              file=out)


def selftest():
    import io
    lines = ['# header']
    # one launch, 2 SMs: SM 0 has warps 0..8 (scheduler 0 holds warps 0, 4, 8), SM 1 warps 0..7; load-3 warps end late
    for sm, nw in ((0, 9), (1, 8)):
        for q in range(nw):
            load = 3 if (sm == 0 and q % 4 == 0) else 2
            p5 = 10000 + (5000 if load == 3 else 0) + q
            st = [0, 100, 200, 300, 1000, p5, p5 + 50, p5 + 60] + [-1] * 6
            lines.append(f'deepseek-v3 w4a16 1 0 0 ws_gemm1 0 {sm} {sm} {q} ' + ' '.join(map(str, st)))
    out = io.StringIO()
    analyse(lines, out)
    s = out.getvalue()
    for want in ('piece warps an SM (over launches): 8: 1, 9: 1', 'the last 5% by P5, by load: 3: 1.00'):
        if want not in s:
            sys.exit('x19f_warp_tail selftest: expected ' + repr(want) + ' in\n' + s)
    print('x19f_warp_tail selftest: ok')


if __name__ == '__main__':
    if sys.argv[1:] == ['--selftest']:
        selftest()
    else:
        with open(sys.argv[1]) as f:
            analyse(f)
