#!/usr/bin/env python3
# Compares the device SASS of two object files (or cubins) per kernel, addresses and encodings stripped: which
# kernels are identical, which differ (instruction counts). Instruction addresses (4 to 6 hex digits: kernels past
# 64 KB of code have 5) are stripped. CUOBJDUMP: the cuobjdump binary (default: cuobjdump on
# PATH; this machine has none: the triton wheel ships one, triton/backends/nvidia/bin/cuobjdump).
#   python3 scripts/sass_compare.py old.o new.o
# SASS_RENAME_NEW='regex=>replacement': applied to the new object's kernel names first (a template parameter
# added with a default keeps the old kernels' code under longer names), e.g. 'ELb([01])ELb0EEEv14=>ELb\\1EEEv14'.
import os, re, subprocess, sys
CU=os.environ.get('CUOBJDUMP','cuobjdump')
def funcs(o):
    out=subprocess.run([CU,'-sass',o],capture_output=True,text=True).stdout
    d={};cur=None
    for l in out.split('\n'):
        m=re.search(r'Function : (\S+)',l)
        if m: cur=m.group(1); d[cur]=[]; continue
        if cur is None: continue
        # the per-file header after a file's last function names the source path: not that function's code
        if re.match(r'\s*(identifier|Fatbin|code for|arch =|code version|host =|compile_size|=+$)', l): continue
        l=re.sub(r'/\*[0-9a-f]{4,6}\*/','',l); l=re.sub(r'/\* 0x[0-9a-f]+ \*/','',l).rstrip()
        if l.strip(): d[cur].append(l)
    return d
a=funcs(sys.argv[1]); b=funcs(sys.argv[2])
if os.environ.get('SASS_RENAME_NEW'):
    pat,rep=os.environ['SASS_RENAME_NEW'].split('=>',1)
    b={re.sub(pat,rep,k):v for k,v in b.items()}
same=diff=0
for k in sorted(set(a)&set(b)):
    if a[k]==b[k]: same+=1
    else: diff+=1; print('DIFF',k[:110],len(a[k]),len(b[k]))
print('only in first',len(set(a)-set(b)),'only in second',len(set(b)-set(a)),'same',same,'diff',diff)
