"""benchmarks/sass_yield.py (the v58 experiment's patcher) on a synthetic binary and listing: only the
reuse-flagged FFMAs in the asked share of each long run change, and only in their reuse and yield bits; short
runs, other functions and other instructions are left alone; the patched code is found and written in the
binary; a binary without the listed code is refused. (On a real binary the script also checks cuobjdump's
listing of its output; that needs the CUDA toolkit's cuobjdump.)"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import sass_yield  # noqa: E402

REUSE_B = 1 << 59


def _ffma(n, reuse, salt=0):
    lo = 0x7223 | (n << 16) | (salt << 40)        # any low word, distinct per instruction and function
    hi = 0x000FC20000000000 | n | ((REUSE_B | sass_yield.YIELD_BIT) if reuse else 0)
    return f"FFMA R{n}, R{n + 1}, R2{'.reuse' if reuse else ''}, R{n}", lo, hi


def _program():
    """[(function, text, lo, hi)]: a run of 20 FFMA (every other one reuse-flagged) in gemm_fp8, a run of 8, an
    FMUL between; the same shape of code in another function."""
    code = []
    for salt, func in enumerate(("_Z18grouped_gemm_fp8_nt_kernel", "_Z5other")):
        for n in range(20):
            code.append((func,) + _ffma(n, n % 2 == 1, salt))
        code.append((func, "FMUL R1, R2, R3", 0x7220, 0x000FC20000000001))
        for n in range(100, 108):
            code.append((func,) + _ffma(n, True, salt))
    return code


def _binary(code):
    body = {}
    for func, _, lo, hi in code:
        body.setdefault(func, b"")
        body[func] += sass_yield.as_bytes(lo, hi)
    return b"\x01" * 64 + b"".join(body.values()) + b"\x02" * 64


def _listing_of(path, code):
    """What cuobjdump would list for the binary at path: the code's instructions read back from its bytes."""
    data = open(path, "rb").read()
    at, out = 64, []
    for func, text, _, _ in code:
        lo, hi = int.from_bytes(data[at:at + 8], "little"), int.from_bytes(data[at + 8:at + 16], "little")
        at += 16
        text = text.replace(".reuse", "") if not hi & sass_yield.REUSE_BITS else text
        out.append((func, text, lo, hi))
    return out


@pytest.fixture
def fake(tmp_path, monkeypatch):
    code = _program()
    src = tmp_path / "bin"
    src.write_bytes(_binary(code))
    # cuobjdump's listing: the program for the input, the bytes read back for the output
    monkeypatch.setattr(sass_yield, "instructions", lambda path: code if path == str(src) else _listing_of(path, code))
    return code, src, tmp_path / "out"


@pytest.mark.parametrize("fraction, want", [(0.5, 5), (1.0, 10), (0.0, 0)])
def test_only_the_runs_reuse_flagged_ffma_in_the_share_change(fake, fraction, want):
    code, src, out = fake
    runs, changed = sass_yield.patch(str(src), str(out), fraction, "grouped_gemm_fp8", 16)
    assert (runs, changed) == (1, want)
    before, after = src.read_bytes(), out.read_bytes()
    assert len(before) == len(after) and before[:64] == after[:64] and before[-64:] == after[-64:]
    got = _listing_of(str(out), code)
    for i, ((func, _, lo, hi), (_, _, lo2, hi2)) in enumerate(zip(code, got)):
        assert lo2 == lo  # opcodes and operands untouched
        touched = func.endswith("kernel") and i < 20 and i % 2 == 1 and i < fraction * 20
        if touched:
            assert hi2 == hi & ~(sass_yield.REUSE_BITS | sass_yield.YIELD_BIT), i
        else:
            assert hi2 == hi, i  # the other function, the short run, the FMUL, the unflagged FFMA


def test_a_binary_without_the_listed_code_is_refused(fake):
    code, src, out = fake
    src.write_bytes(b"\x00" * 4096)
    with pytest.raises(SystemExit, match="not found"):
        sass_yield.patch(str(src), str(out), 1.0, "grouped_gemm_fp8", 16)
