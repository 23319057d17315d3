import csv, sys, collections
def load(path):
    lines = open(path).read().split('\n')
    # multiple kernels: each begins with "Kernel Name" line
    kernels = []; cur=None
    for ln in lines:
        if ln.startswith('"Kernel Name"'):
            cur=[ln]; kernels.append(cur)
        elif cur is not None and ln.strip():
            cur.append(ln)
    out=[]
    for k in kernels:
        name=k[0]
        rows=list(csv.reader(k[1:]))
        h=rows[0]; out.append((name,h,rows[1:]))
    return out
for path in sys.argv[1:]:
    for name,h,rows in load(path):
        si=[i for i,c in enumerate(h) if c.startswith('stall_') and 'Not Issued' not in c]
        tot=collections.Counter(); n=0; inst=0
        ie=h.index('Instructions Executed')
        # k-loop region: instructions executed >= max/4 (hot)
        mx=max(int(r[ie] or 0) for r in rows)
        hot=[r for r in rows if int(r[ie] or 0) >= mx*0.5]
        for r in hot:
            for i in si: tot[h[i]]+=int(r[i] or 0)
        allt=collections.Counter()
        for r in rows:
            for i in si: allt[h[i]]+=int(r[i] or 0)
        print(path.split('/')[-1], name.split('<')[1][:60] if '<' in name else name[:60])
        print('  hot instrs',len(hot),'exec each',mx,' samples hot',sum(tot.values()),' all',sum(allt.values()))
        print('  hot:', ', '.join(f"{k[6:]}={v}" for k,v in tot.most_common(9)))
