#!/usr/bin/env python3
# Usage: python3 bench/ab_table.py DIR base,variant2,...
# Prints a markdown table of an A/B directory written by scripts/device_variant_ab.sh: one row per
# (preset, mode, T), one column per variant (us per layer, each repeat), and each variant's ratio to the first.
import json, glob, os, re, sys, collections
if len(sys.argv) != 3:
    sys.exit('usage: python3 bench/ab_table.py DIR base,variant2,...  (DIR: the *-ab-<variant>-*.json of one A/B)')
d = sys.argv[1]; order = sys.argv[2].split(',')
vals = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(os.path.join(d, '*-ab-*.json'))):
    m = re.search(r'-ab-([^-]+)-(.+)-(w4a[^-]+)-r(\d+)\.json$', os.path.basename(f))
    if not m:
        continue  # not a device_variant_ab.sh result
    var = m.group(1)
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
