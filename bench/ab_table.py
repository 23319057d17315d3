#!/usr/bin/env python3
# Usage: python3 bench/ab_table.py DIR base,variant2,...
# Prints a markdown table of an A/B directory written by scripts/device_variant_ab.sh: one row per
# (preset, mode, T), one column per variant (us per layer, each repeat), and each variant's ratio to the first.
# --selftest: the table of a synthetic A/B whose variant names contain '-' and prefix each other.
import json, glob, os, re, sys, collections, io, tempfile, contextlib


def selftest():
    with tempfile.TemporaryDirectory() as d:
        for var, us in (('all', 10.0), ('all-warps', 9.0), ('piece-warps', 11.0)):
            for r in (1, 2):
                with open(os.path.join(d, f'abc1234-ab-{var}-qwen3-30b-t1-w4a4-r{r}.json'), 'w') as f:
                    json.dump({'rows': [{'preset': 'qwen3-30b', 'mode': 'w4a4', 'tokens': 1, 'us_per_layer': us}]}, f)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            table(d, ['all', 'all-warps', 'piece-warps'])
        want = '| qwen3-30b | w4a4 | 1 | 10.0 / 10.0 | 9.0 / 9.0 | 11.0 / 11.0 | 0.900 | 1.100 |'
        if want not in out.getvalue():
            sys.exit('ab_table selftest: expected\n' + want + '\ngot\n' + out.getvalue())
    print('ab_table selftest: ok')


def table(d, order):
    vals = collections.defaultdict(lambda: collections.defaultdict(list))
    # A file's variant: the longest of the given names that the file name carries after '-ab-' (names may contain '-').
    by_length = sorted(order, key=len, reverse=True)
    for f in sorted(glob.glob(os.path.join(d, '*-ab-*.json'))):
        name = os.path.basename(f)
        var = next((v for v in by_length if re.search('-ab-' + re.escape(v) + r'-.+-w4a[^-]+-r\d+\.json$', name)), None)
        if var is None:
            continue  # not a device_variant_ab.sh result, or another variant
        for r in json.load(open(f))['rows']:
            vals[(r['preset'], r['mode'], r['tokens'])][var].append(r['us_per_layer'])
    print('| preset | mode | T | ' + ' | '.join(order) + ' | ' + ' | '.join(f'{v} / {order[0]}' for v in order[1:]) + ' |')
    print('|' + '---|' * (3 + 2 * len(order) - 1))
    for k in sorted(vals):
        row = vals[k]
        cells = [' / '.join(f'{x:.1f}' for x in row.get(v, [])) for v in order]
        base = sum(row[order[0]]) / len(row[order[0]]) if row.get(order[0]) else None
        ratios = [f'{(sum(row[v]) / len(row[v])) / base:.3f}' if row.get(v) and base else '' for v in order[1:]]
        print(f'| {k[0]} | {k[1]} | {k[2]} | ' + ' | '.join(cells) + ' | ' + ' | '.join(ratios) + ' |')


if __name__ == '__main__':
    if sys.argv[1:] == ['--selftest']:
        selftest()
    elif len(sys.argv) != 3:
        sys.exit('usage: python3 bench/ab_table.py DIR base,variant2,...  (DIR: the *-ab-<variant>-*.json of one A/B)')
    else:
        table(sys.argv[1], sys.argv[2].split(','))
