#!/usr/bin/env python3
# Two checks on the SASS of an object file (or cubin) that the kernels' shared-memory stages are not reused while
# a shared-memory load (LDS / LDSM) of them is still in flight. ptxas does not make an mbarrier arrive or a
# cp.async wait wait for earlier shared loads: a load completes when a later instruction waits on its scoreboard.
#  1. arrives (every kernel): an mbarrier arrive (SYNCS.ARRIVE) that releases a stage to the producer must not be
#     issued while a shared load issued since the last mbarrier wait is in flight, or the stage's next TMA may
#     land before the load reads it (docs/gemm.md, "The mma.sync consumers released a stage with its ldmatrix
#     loads in flight").
#  2. ring refills (the warp-streaming kernels, whose warps refill their own ring by cp.async): every shared load
#     must have completed before the next cp.async wait (DEPBAR) it can reach along any path (branches and loop
#     back-edges followed). The k-loop reads slot kt after the wait for k-tile kt and refills slot kt - 1 after it
#     (sm90_nvfp4_warp_stream_gemm.cuh), so a read of slot kt still in flight at the next k-tile's wait would
#     still be in flight when that slot is refilled. A load that ptxas gives no scoreboard completes with the
#     next scoreboarded shared load or shuffle (the shared-memory pipe's operations complete in order, which
#     ptxas relies on: in the routed b1 kernel an HMMA reads an ldmatrix's registers with only a later SHFL's
#     scoreboard waited on in between). Loading a slot a
#     k-tile ahead (software pipelining) would break this rule on purpose and needs its own argument.
#   python3 scripts/sass_arrive_check.py build/CMakeFiles/nvfp4moe.dir/src/cuda/sm90_nvfp4_grouped_gemm.cu.o [name]
#   python3 scripts/sass_arrive_check.py --self-test   (both rules on synthetic SASS; needs no cuobjdump)
# CUOBJDUMP: the cuobjdump binary (default: cuobjdump on PATH, else the nvidia-cuda-cuobjdump wheel's, with the
# nvidia-cuda-nvdisasm wheel's nvdisasm, which cuobjdump -sass runs). Exit status 1 if a rule is broken, 77
# (CTest's skip) if no cuobjdump is found.
# The control bits read here (Volta and later): bits 105.. of each 128-bit instruction, write scoreboard at
# +5 (3 bits, 7 = none) and the wait mask at +11 (6 bits).
import os, re, shutil, subprocess, sys
import sysconfig

NO_SCOREBOARD = 7


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


def parse(sass):
    """{kernel: [(address, text, write scoreboard, wait mask)]} from `cuobjdump -sass` output."""
    funcs, cur = {}, None
    lines = sass.split('\n')
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
            funcs[cur].append((int(m.group(1), 16), m.group(2).strip(), (ctrl >> 5) & 7, (ctrl >> 11) & 0x3f))
    return funcs


def split(text):
    """(predicate or None, opcode, operands) of one instruction's text."""
    words = text.split()
    pred = words.pop(0) if words[0].startswith('@') else None
    return pred, words[0], ' '.join(words[1:])


def is_shared_load(text):
    pred, op, _ = split(text)
    return pred != '@!PT' and (op == 'LDS' or op.startswith('LDS.') or op.startswith('LDSM'))


def completes_earlier_shared_loads(text):
    """A scoreboarded instruction of the shared-memory pipe, behind which earlier shared loads complete."""
    pred, op, _ = split(text)
    return is_shared_load(text) or (pred != '@!PT' and op.startswith('SHFL'))


def arrives_with_loads_in_flight(ins):
    """Rule 1: (arrives, arrives issued with a shared load since the last mbarrier wait still in flight)."""
    arrives = in_flight = 0
    for k, (_, text, _, _) in enumerate(ins):
        if 'SYNCS.ARRIVE' not in text:
            continue
        arrives += 1
        j = k
        while j > 0 and 'TRYWAIT' not in ins[j][1]:
            j -= 1
        pending = set()
        for q in range(j, k + 1):
            _, t, wb, wm = ins[q]
            pending -= {sb for sb in range(6) if wm >> sb & 1}
            if q < k and re.match(r'(@\S+\s+)?LDS', t) and wb != NO_SCOREBOARD:
                pending.add(wb)
        in_flight += bool(pending)
    return arrives, in_flight


def successors(ins, at, j):
    """Indices that may run after instruction j (branch targets by address in `at`)."""
    pred, op, rest = split(ins[j][1])
    if op == 'EXIT' or op.startswith('RET'):
        return [] if pred is None else [j + 1]
    if op.startswith('BRA'):
        target = re.search(r'(0x[0-9a-f]+)\s*$', rest)
        out = [at[int(target.group(1), 16)]] if target and int(target.group(1), 16) in at else []
        conditional = pred is not None or op != 'BRA'  # BRA.DIV / BRA.U.ANY: taken by some warps only
        return out + ([j + 1] if conditional else [])
    return [j + 1]  # (CALL: the callee returns here)


def loads_in_flight_at_cp_async_wait(ins):
    """Rule 2: [(load address, load text, DEPBAR address)] for shared loads that can reach a cp.async wait
    (DEPBAR.LE) with their scoreboard not yet waited on."""
    at = {a: j for j, (a, _, _, _) in enumerate(ins)}
    found = []
    for i, (addr, text, wb, _) in enumerate(ins):
        if not is_shared_load(text):
            continue
        sb = wb
        if sb == NO_SCOREBOARD:  # completes with the next scoreboarded shared load or shuffle
            sb = next((ins[j][2] for j in range(i + 1, len(ins))
                       if completes_earlier_shared_loads(ins[j][1]) and ins[j][2] != NO_SCOREBOARD), NO_SCOREBOARD)
            if sb == NO_SCOREBOARD:
                continue
        stack, seen = list(successors(ins, at, i)), set()
        while stack:
            j = stack.pop()
            if j in seen or j >= len(ins):
                continue
            seen.add(j)
            _, t, _, wm = ins[j]
            if wm >> sb & 1:
                continue  # this path waited for the load
            if split(t)[1].startswith('DEPBAR'):
                found.append((addr, text, ins[j][0]))
                break
            stack.extend(successors(ins, at, j))
    return found


def check(funcs, pattern=''):
    status = 0
    for name, ins in funcs.items():
        if pattern not in name:
            continue
        arrives, in_flight = arrives_with_loads_in_flight(ins)
        if arrives:
            print(f'{name}: {arrives} arrives, {in_flight} with shared loads in flight')
            status |= in_flight > 0
        if 'warp_stream' in name:
            bad = loads_in_flight_at_cp_async_wait(ins)
            print(f'{name}: {sum(is_shared_load(t) for _, t, _, _ in ins)} shared loads, {len(bad)} in flight '
                  f'at a later cp.async wait')
            for addr, text, dep in bad[:5]:
                print(f'  {addr:#x} {text} reaches DEPBAR at {dep:#x} unwaited')
            status |= len(bad) > 0
    return status


def self_test():
    """Both rules on hand-written SASS: each must pass the safe sequence and fail the broken one."""
    def ins(rows):  # (text, write scoreboard, wait mask), addresses 0x10 apart
        return [(0x10 * k, t, wb, wm) for k, (t, wb, wm) in enumerate(rows)]
    N = NO_SCOREBOARD
    # A k-loop: wait for the ring, read the slot (scoreboard 1), refill, consume the load, branch back.
    loop_safe = ins([('DEPBAR.LE SB0, 0x2', N, 0), ('LDS.128 R4, [R2]', 1, 0), ('LDGSTS.E [R3], [R6.64]', N, 0),
                     ('HMMA.16816.F32.BF16 R8, R4, R10, R8', N, 0b10), ('@P0 BRA 0x0', N, 0), ('EXIT', N, 0)])
    loop_bad = ins([('DEPBAR.LE SB0, 0x2', N, 0), ('LDS.128 R4, [R2]', 1, 0), ('LDGSTS.E [R3], [R6.64]', N, 0),
                    ('@P0 BRA 0x0', N, 0), ('HMMA.16816.F32.BF16 R8, R4, R10, R8', N, 0b10), ('EXIT', N, 0)])
    # A load without a scoreboard, covered by a later one that is waited on (safe), or not (broken).
    cover_safe = ins([('LDS R4, [R2]', N, 0), ('LDSM.16.M88.4 R8, [R3]', 2, 0), ('IADD3 R1, R8, R4, RZ', N, 0b100),
                      ('DEPBAR.LE SB0, 0x1', N, 0), ('EXIT', N, 0)])
    cover_bad = ins([('LDS R4, [R2]', N, 0), ('LDSM.16.M88.4 R8, [R3]', 2, 0), ('DEPBAR.LE SB0, 0x1', N, 0),
                     ('IADD3 R1, R8, R4, RZ', N, 0b100), ('EXIT', N, 0)])
    # ... covered by a later shuffle (the same pipe) that is waited on (safe), or not (broken).
    shfl_safe = ins([('LDSM.16.M88.4 R8, [R3]', N, 0), ('SHFL.IDX PT, R4, R5, R6, 0x1f', 1, 0),
                     ('HMMA.16816.F32.BF16 R12, R8, R4, R12', N, 0b10), ('DEPBAR.LE SB0, 0x1', N, 0), ('EXIT', N, 0)])
    shfl_bad = ins([('LDSM.16.M88.4 R8, [R3]', N, 0), ('SHFL.IDX PT, R4, R5, R6, 0x1f', 1, 0),
                    ('DEPBAR.LE SB0, 0x1', N, 0), ('HMMA.16816.F32.BF16 R12, R8, R4, R12', N, 0b10), ('EXIT', N, 0)])
    # A stage release: the arrive after the MMA that consumed the ldmatrix (safe), or before it (broken).
    arrive_safe = ins([('SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1], R2', N, 0), ('LDSM.16.M88.4 R8, [R3]', 3, 0),
                       ('HMMA.16816.F32.BF16 R12, R8, R4, R12', N, 0b1000), ('SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R5]', N, 0)])
    arrive_bad = ins([('SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1], R2', N, 0), ('LDSM.16.M88.4 R8, [R3]', 3, 0),
                      ('SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R5]', N, 0), ('HMMA.16816.F32.BF16 R12, R8, R4, R12', N, 0b1000)])
    results = {
        'ring, loop consumes before branching back': not loads_in_flight_at_cp_async_wait(loop_safe),
        'ring, load in flight around the back-edge': bool(loads_in_flight_at_cp_async_wait(loop_bad)),
        'ring, unscoreboarded load covered and waited': not loads_in_flight_at_cp_async_wait(cover_safe),
        'ring, unscoreboarded load covered, not waited': bool(loads_in_flight_at_cp_async_wait(cover_bad)),
        'ring, unscoreboarded load covered by a waited shuffle': not loads_in_flight_at_cp_async_wait(shfl_safe),
        'ring, unscoreboarded load covered by a shuffle, not waited': bool(loads_in_flight_at_cp_async_wait(shfl_bad)),
        'arrive after the consuming MMA': arrives_with_loads_in_flight(arrive_safe) == (1, 0),
        'arrive before the consuming MMA': arrives_with_loads_in_flight(arrive_bad) == (1, 1),
    }
    for what, ok in results.items():
        print(f'{"ok  " if ok else "FAIL"} {what}')
    return 0 if all(results.values()) else 1


if __name__ == '__main__':
    if len(sys.argv) > 1 and sys.argv[1] == '--self-test':
        sys.exit(self_test())
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        print('sass_arrive_check: no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm): skipped')
        sys.exit(77)
    out = subprocess.run([cuobjdump, '-sass', sys.argv[1]], capture_output=True, text=True, check=True).stdout
    if 'Function :' not in out:
        print(f'sass_arrive_check: no device code in {sys.argv[1]}')
        sys.exit(1)
    sys.exit(check(parse(out), sys.argv[2] if len(sys.argv) > 2 else ''))
