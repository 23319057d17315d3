#!/usr/bin/env python3
# Lists, per kernel of an object file (or cubin), the mbarrier arrives (SYNCS.ARRIVE) that are issued while a
# shared-memory load (LDS / LDSM) of the same stage is still in flight: a load issued since the last mbarrier
# wait whose scoreboard no instruction up to the arrive has waited on. ptxas does not make an arrive wait for
# such loads, so an arrive that releases a stage to the producer must come after an instruction that consumes
# what was loaded (the loaded registers), or the stage's next TMA may land before the load reads it (docs/gemm.md,
# "The mma.sync consumers released a stage with its ldmatrix loads in flight").
#   python3 scripts/sass_arrive_check.py build/CMakeFiles/nvfp4moe.dir/src/cuda/sm90_nvfp4_grouped_gemm.cu.o [name]
# CUOBJDUMP: the cuobjdump binary (default: cuobjdump on PATH, else the nvidia-cuda-cuobjdump wheel's, with the
# nvidia-cuda-nvdisasm wheel's nvdisasm, which cuobjdump -sass runs). Exit status 1 if any arrive has loads in
# flight, 77 (CTest's skip) if no cuobjdump is found.
# The control bits read here (Volta and later): bits 105.. of each 128-bit instruction, write scoreboard at
# +5 (3 bits, 7 = none) and the wait mask at +11 (6 bits).
import os, re, shutil, subprocess, sys
import sysconfig


def find_cuobjdump():
    if os.environ.get('CUOBJDUMP'):
        return os.environ['CUOBJDUMP']
    if shutil.which('cuobjdump') and shutil.which('nvdisasm'):
        return 'cuobjdump'
    sites = {sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']}
    python3 = shutil.which('python3')  # (this interpreter may be a virtual environment's; setup.sh installs there)
    if python3:
        q = subprocess.run([python3, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                           capture_output=True, text=True)
        if q.returncode == 0:
            sites.add(q.stdout.strip())
    for site in sites:
        for cu in ('cu13', 'cu12'):
            tool = os.path.join(site, 'nvidia', cu, 'bin', 'cuobjdump')
            if os.path.exists(tool):
                os.environ['PATH'] = os.path.dirname(tool) + os.pathsep + os.environ.get('PATH', '')
                return tool
    return None


cuobjdump = find_cuobjdump()
if cuobjdump is None:
    print('sass_arrive_check: no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm): skipped')
    sys.exit(77)
out = subprocess.run([cuobjdump, '-sass', sys.argv[1]], capture_output=True, text=True, check=True).stdout
if 'Function :' not in out:
    print(f'sass_arrive_check: no device code in {sys.argv[1]}')
    sys.exit(1)
pattern = sys.argv[2] if len(sys.argv) > 2 else ''
funcs, cur = {}, None
lines = out.split('\n')
for i, l in enumerate(lines):
    m = re.search(r'Function : (\S+)', l)
    if m:
        cur = m.group(1)
        funcs[cur] = []
        continue
    m = re.search(r'/\*([0-9a-f]{4,6})\*/\s+(.*?);\s*/\* (0x[0-9a-f]+) \*/', l)
    if m and cur is not None:
        hi = int(re.search(r'/\* (0x[0-9a-f]+) \*/', lines[i + 1]).group(1), 16)
        ctrl = hi >> 41
        funcs[cur].append((m.group(2).strip(), (ctrl >> 5) & 7, (ctrl >> 11) & 0x3f))
status = 0
for name, ins in funcs.items():
    if pattern not in name:
        continue
    arrives = in_flight = 0
    for k, (text, _, _) in enumerate(ins):
        if 'SYNCS.ARRIVE' not in text:
            continue
        arrives += 1
        j = k
        while j > 0 and 'TRYWAIT' not in ins[j][0]:
            j -= 1
        pending = set()
        for q in range(j, k + 1):
            t, wb, wm = ins[q]
            pending -= {sb for sb in range(6) if wm >> sb & 1}
            if q < k and re.match(r'(@\S+\s+)?LDS', t) and wb != 7:
                pending.add(wb)
        in_flight += bool(pending)
    if arrives:
        print(f'{name}: {arrives} arrives, {in_flight} with shared loads in flight')
        status |= in_flight > 0
sys.exit(status)
