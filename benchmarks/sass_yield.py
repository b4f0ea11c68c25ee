"""Marks more of a kernel's FP32-promotion FFMAs as yield points, in a built binary (an experiment: performance
log v58). Why: the FP8 GEMM's promotion (96 FFMA per K-block and thread) runs at about a third of the issue
rate and does not overlap the other consumer warpgroup's wgmma (v31, v38); DeepSeek reported 10%+ on their FP8
GEMMs from letting the scheduler switch warps inside such FFMA runs, a control bit that nvcc does not expose.

What it changes, and only that: in each run of at least --min-run consecutive FFMA instructions of the
functions matching --functions, the first --fraction of the run's FFMAs that carry an operand-reuse flag lose
it and get the yield hint (control bit 109 of the 128-bit instruction cleared: ptxas itself clears it on the
run's other FFMAs, every other one, which carry no reuse flag). Both are scheduling hints: the arithmetic,
registers and order are untouched (an instruction that may yield must not leave an operand in the reuse cache
for the next, hence the flag goes with it). Afterwards cuobjdump of the output must list the same
instructions as the input's, apart from the `.reuse` marks removed; the script checks that and says how many
instructions it changed.

    python3 benchmarks/sass_yield.py BIN OUT [--fraction 0.5] [--functions REGEX]

BIN: an executable or shared library whose sm_90a code is stored uncompressed (nvcc's default here; the
script fails if it cannot find an instruction's bytes). Used by fp8_check_variants.sh's `yield=F` flag.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

YIELD_BIT = 1 << 45          # in the instruction's high 64-bit word: 0 lets the warp yield
REUSE_BITS = 0xF << 58       # the four operand-reuse flags


def cuobjdump_path():
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    nvcc = shutil.which("nvcc")
    if nvcc:
        cand = os.path.join(os.path.dirname(os.path.realpath(nvcc)), "cuobjdump")
        if os.path.exists(cand):
            return cand
    sys.exit("sass_yield: cuobjdump not found (PATH, or beside nvcc)")


_INSN = re.compile(r"/\*[0-9a-f]{4}\*/\s+(.*?)\s*;\s*/\*\s*(0x[0-9a-f]+)\s*\*/")
_HEX = re.compile(r"^\s*/\*\s*(0x[0-9a-f]+)\s*\*/\s*$")


def instructions(binary):
    """[(function, text, lo, hi)] in listing order, from cuobjdump -sass."""
    out = subprocess.run([cuobjdump_path(), "-sass", binary], capture_output=True, text=True, check=True).stdout
    lines, insns, func = out.splitlines(), [], None
    for i, line in enumerate(lines):
        if "Function :" in line:
            func = line.split("Function :", 1)[1].strip()
            continue
        m = _INSN.search(line)
        if m and i + 1 < len(lines):
            h = _HEX.match(lines[i + 1])
            if h:
                insns.append((func, m.group(1), int(m.group(2), 16), int(h.group(1), 16)))
    return insns


def opcode(text):
    words = text.split()
    return words[1] if words and words[0].startswith("@") else (words[0] if words else "")


def ffma_runs(insns, functions, min_run):
    """Index lists of runs of >= min_run consecutive FFMA in the functions matching `functions`."""
    runs, cur = [], []
    for i, (func, text, _, _) in enumerate(insns):
        if func and re.search(functions, func) and opcode(text).startswith("FFMA"):
            if cur and (i != cur[-1] + 1 or insns[cur[-1]][0] != func):
                if len(cur) >= min_run:
                    runs.append(cur)
                cur = []
            cur.append(i)
        else:
            if len(cur) >= min_run:
                runs.append(cur)
            cur = []
    if len(cur) >= min_run:
        runs.append(cur)
    return runs


def as_bytes(lo, hi):
    return lo.to_bytes(8, "little") + hi.to_bytes(8, "little")


def patch(binary, out, fraction, functions, min_run):
    insns = instructions(binary)
    runs = ffma_runs(insns, functions, min_run)
    words = [[lo, hi] for _, _, lo, hi in insns]
    changed = 0
    for run in runs:
        for n, i in enumerate(run):
            hi = words[i][1]
            if n < fraction * len(run) and hi & REUSE_BITS and hi & YIELD_BIT:
                words[i][1] = hi & ~(REUSE_BITS | YIELD_BIT)
                changed += 1
    # Each function's code is found in the binary as the whole byte string of its listing and replaced there,
    # at every copy: code identical to a patched function's (another kernel's, or the same kernel stored twice)
    # is patched alike; a run alone could recur inside other code, a whole function's code does not.
    data = bytearray(open(binary, "rb").read())
    spans = {}
    for i, (func, _, _, _) in enumerate(insns):
        spans.setdefault(func, [i, i])[1] = i
    for func, (a, b) in spans.items():
        old = b"".join(as_bytes(lo, hi) for _, _, lo, hi in insns[a:b + 1])
        new = b"".join(as_bytes(lo, hi) for lo, hi in words[a:b + 1])
        if new == old:
            continue
        at, hits = data.find(old), 0
        while at >= 0:
            data[at:at + len(old)] = new
            hits += 1
            at = data.find(old, at + len(old))
        if hits == 0 and data.find(new) < 0:
            sys.exit(f"sass_yield: the code of {func} not found in {binary} (compressed device code?)")
    with open(out, "wb") as f:
        f.write(data)
    shutil.copymode(binary, out)
    # the same instructions, apart from the reuse marks
    strip = lambda t: t.replace(".reuse", "")  # noqa: E731
    before = [(f, strip(t), lo) for f, t, lo, _ in insns]
    after = [(f, strip(t), lo) for f, t, lo, _ in instructions(out)]
    if before != after:
        sys.exit("sass_yield: the patched listing differs beyond the reuse marks")
    return len(runs), changed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("binary")
    p.add_argument("out")
    p.add_argument("--fraction", type=float, default=0.5,
                   help="the share of each run (from its start) whose reuse-flagged FFMAs become yield points")
    p.add_argument("--functions", default="grouped_gemm_fp8_nt_kernel", help="regex on the mangled names")
    p.add_argument("--min-run", type=int, default=16)
    a = p.parse_args(argv)
    runs, changed = patch(a.binary, a.out, a.fraction, a.functions, a.min_run)
    print(f"sass_yield: {changed} FFMA made yield points in {runs} runs of >= {a.min_run} (fraction {a.fraction})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
