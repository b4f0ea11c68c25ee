"""The device scripts (benchmarks/*.sh) run only on the GPU machine, where a mistake costs device time: here they
must at least parse, refuse what they cannot do before touching a GPU, and (run_fp8_session.sh's SQ_AB path, with
stand-in nvcc and nvidia-smi that build programs printing a line) walk their steps and leave their files in OUT."""
import os
import pathlib
import shutil
import stat
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.sh"))

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_device_script_parses(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def _stub(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def stub_path(tmp_path):
    """A PATH whose nvcc writes, for -o OUT, a program printing its name and arguments, and whose nvidia-smi
    prints a line: enough for the scripts' standalone harness steps to run end to end without a GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "nvcc", '#!/bin/bash\no=""\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && { o=$2; shift; }; shift; done\n'
                            'printf \'#!/bin/bash\\necho "R=1 I=1: stand-in $0 $*"\\n\' > "$o"; chmod +x "$o"\n')
    _stub(bin_dir / "nvidia-smi", "#!/bin/bash\necho stand-in GPU\n")
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def test_skip_build_refuses_the_options_that_need_the_extension(tmp_path, stub_path):
    env = dict(os.environ, PATH=stub_path, OUT=str(tmp_path / "out"), SKIP_BUILD="1", TRACE="1")
    res = subprocess.run(["bash", str(ROOT / "benchmarks/run_fp8_session.sh")], env=env, capture_output=True, text=True)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "SKIP_BUILD=1 leaves no extension" in res.stdout
    assert not (tmp_path / "out").exists()  # refused before the session started


def test_sq_ab_without_a_build_runs_both_harnesses_in_turn(tmp_path, stub_path):
    old = tmp_path / "old"  # the older tree's copy: only what the stand-in nvcc is handed
    (old / "benchmarks").mkdir(parents=True)
    (old / "benchmarks/swiglu_quant_timing.cu").write_text("")
    out = tmp_path / "out"
    env = dict(os.environ, PATH=stub_path, OUT=str(out), SKIP_BUILD="1", SQ_AB=str(old), SQ_AB_ROUNDS="1",
               SQ_AB_PROBLEMS="131072 768")
    res = subprocess.run(["bash", str(ROOT / "benchmarks/run_fp8_session.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "build:" not in res.stdout  # no extension built
    ab = (out / "swiglu_quant_ab.txt").read_text().splitlines()
    assert ab == ["== old round 1", "R=1 I=1: stand-in /tmp/mok_sqt_old 131072 768",
                  "== new round 1", "R=1 I=1: stand-in /tmp/mok_sqt_new 131072 768"]
    assert (out / "env.txt").read_text().startswith("stand-in GPU")


@pytest.fixture
def checker_stub_path(tmp_path):
    """A PATH whose nvcc logs each build to BUILDS and writes, for -o OUT, a stand-in for the FP8 checker: it prints
    the checker's line for its arguments (forward R E N K, or wgrad / wgrad_tiled R E M N) and, where built with
    -DMOK_SM90_TIMING, the timing build's cycle lines first; its output bits' fingerprint is 00ff unless built with
    -DOTHERBITS; it fails for a build with -DBROKEN."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "nvcc", '#!/bin/bash\necho "$*" >> "$BUILDS"\nt=0\nb=00ff\nfor a in "$@"; do\n'
                            '  [ "$a" = -DBROKEN ] && exit 1\n  [ "$a" = -DMOK_SM90_TIMING ] && t=1\n'
                            '  [ "$a" = -DOTHERBITS ] && b=0f0f\ndone\n'
                            'o=""\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && { o=$2; shift; }; shift; done\n'
                            '{ echo "#!/bin/bash"\n'
                            '  [ $t = 1 ] && echo \'echo "  mainloop        6479 cycles     3.27 us"; '
                            'echo "  epilogue        1566 cycles     0.79 us"\'\n'
                            '  echo \'if [ "${1#wgrad}" != "$1" ]; then echo "$1 R=$2 E=$3 M=$4 N=$5: 1.0 ms, 800 TFLOP/s, '
                            'sampled rel err 1.6e-03 (ok) bits \'$b\'"; else echo "R=$1 E=$2 N=$3 K=$4: 1.0 ms, '
                            '900 TFLOP/s, sampled rel err 1.6e-03 (ok) bits \'$b\'"; fi\'\n} > "$o"\nchmod +x "$o"\n')
    _stub(bin_dir / "nvidia-smi", "#!/bin/bash\necho stand-in GPU\n")
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def test_fp8_pipe_session_runs_forward_wgrad_and_timing_on_one_set_of_builds(tmp_path, checker_stub_path):
    out, builds = tmp_path / "out", tmp_path / "builds.txt"
    env = dict(os.environ, PATH=checker_stub_path, OUT=str(out), BUILDS=str(builds),
               VARIANTS="def: half2:-DMOK_SM90_FP8_HALF_PIPE=2", WVARIANTS="def: wg2:-DMOK_SM90_FP8_HALF_PIPE_WGRAD=2")
    env.pop("BIN", None)
    res = subprocess.run(["bash", str(ROOT / "benchmarks/run_fp8_pipe_session.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    built = builds.read_text().splitlines()
    # the forward's two variants, the weight gradients' one more (def is reused by both of their passes), then
    # the forward variants' two timing builds
    assert len(built) == 5, built
    assert sum("-DMOK_SM90_TIMING" in b for b in built) == 2
    fwd = (out / "fwd.txt").read_text()
    assert "65536x32x4096x7168" in fwd and "8192x8x1536x128" in fwd
    half2_fwd = fwd.splitlines()[-1]
    assert half2_fwd.startswith("half2" + " " * 26 + "900 (900-900)")
    assert "bits!=" not in half2_fwd  # the same output bits as def
    for name in ("wgrad", "wgrad_tiled"):
        assert (out / f"{name}.txt").read_text().splitlines()[-1].startswith("wg2" + " " * 28 + "800 (800-800)")
        assert f"wg2 round 2: {name} R=16384 E=8 M=28672 N=4096" in (out / name / "fp8_check_variants.txt").read_text()
    assert "thalf2 131072x128x2048x768: mainloop 6479 cycles 3.27 us epilogue 1566 cycles 0.79 us" in res.stdout


def test_fp8_check_variants_does_not_time_an_older_binary_when_a_build_fails(tmp_path, checker_stub_path):
    bin_dir = tmp_path / "variants"
    bin_dir.mkdir()
    _stub(bin_dir / "bad", "#!/bin/bash\necho 'R=1 E=1 N=128 K=128: 1.0 ms, 999 TFLOP/s, sampled rel err 1e-3 (ok)'\n")
    env = dict(os.environ, PATH=checker_stub_path, OUT=str(tmp_path / "out"), BUILDS=str(tmp_path / "b.txt"),
               BIN=str(bin_dir), VARIANTS="def: bad:-DBROKEN", PROBLEMS="1 1 128 128", ROUNDS="1")
    res = subprocess.run(["bash", str(ROOT / "benchmarks/fp8_check_variants.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "build of bad failed" in res.stdout
    assert "999" not in res.stdout


def test_fp8_check_variants_marks_a_variant_whose_output_bits_differ_from_the_first(tmp_path, checker_stub_path):
    env = dict(os.environ, PATH=checker_stub_path, OUT=str(tmp_path / "out"), BUILDS=str(tmp_path / "b.txt"),
               BIN=str(tmp_path / "variants"), VARIANTS="def: same:-DX=1 other:-DOTHERBITS", PROBLEMS="1 1 128 128",
               ROUNDS="2")
    res = subprocess.run(["bash", str(ROOT / "benchmarks/fp8_check_variants.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    table = {line.split()[0]: line for line in res.stdout.splitlines()[-3:]}
    assert table["def"].endswith("900 (900-900)") and table["same"].endswith("900 (900-900)")
    assert table["other"].endswith("900 (900-900) bits!=")


def test_fp8_pipe_session_without_timing_builds_only_the_variants(tmp_path, checker_stub_path):
    out, builds = tmp_path / "out", tmp_path / "builds.txt"
    env = dict(os.environ, PATH=checker_stub_path, OUT=str(out), BUILDS=str(builds), TIMING="0",
               VARIANTS="def: half2:-DMOK_SM90_FP8_HALF_PIPE=2", WVARIANTS="def: half2:-DMOK_SM90_FP8_HALF_PIPE=2")
    env.pop("BIN", None)
    res = subprocess.run(["bash", str(ROOT / "benchmarks/run_fp8_pipe_session.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(builds.read_text().splitlines()) == 2
    assert not (out / "timing").exists() and "timing (" not in res.stdout
    assert "half2" in (out / "wgrad.txt").read_text().splitlines()[-1]


def test_fp8_gap_probe_times_both_data_kinds_and_call_counts_with_the_clock(tmp_path):
    """fp8_gap_probe.sh with a stand-in checker whose TFLOP/s depend on MOK_FP8_CHECK_DATA and MOK_FP8_CHECK_ITERS
    and a stand-in nvidia-smi sampling 1500 MHz at 600 W: every problem gets the four modes, each run's line its
    clock, and the table the medians and TFLOP/s per GHz."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "nvcc", '#!/bin/bash\no=""\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && { o=$2; shift; }; shift; done\n'
                            '{ echo "#!/bin/bash"\n'
                            '  echo \'[ "$MOK_FP8_CHECK_BALANCED" = 1 ] || exit 3\'\n'
                            '  echo \'t=900; [ "$MOK_FP8_CHECK_DATA" = gauss ] && t=810\'\n'
                            '  echo \'[ "$MOK_FP8_CHECK_ITERS" = 300 ] && t=$((t - 30))\'\n'
                            '  echo \'sleep 0.3; echo "small: (ok)"; echo "R=$1 E=$2 N=$3 K=$4: 1.0 ms, $t TFLOP/s, '
                            'sampled rel err 1.6e-03 (ok) bits 00ff"\'\n} > "$o"\nchmod +x "$o"\n')
    _stub(bin_dir / "nvidia-smi", '#!/bin/bash\nif [[ "$*" == *-lms* ]]; then\n'
                                  '  while true; do echo "1500, 600"; sleep 0.05; done\nelse echo stand-in GPU; fi\n')
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(out), ROUNDS="1",
               PROBLEMS="64 2 128 128;128 4 256 128")
    res = subprocess.run(["bash", str(ROOT / "benchmarks/fp8_gap_probe.sh")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = (out / "fp8_gap_probe.txt").read_text().splitlines()
    assert len(lines) == 8, lines
    assert all("| clock 1500 MHz power 600 W" in line for line in lines), lines
    table = res.stdout[res.stdout.index("problem"):].splitlines()[1:]
    rows = {(r.split()[0], " ".join(r.split()[1:3])): r.split()[3:] for r in table}
    assert set(rows) == {(p, m) for p in ("64x2x128x128", "128x4x256x128")
                         for m in ("uniform x10", "uniform x300", "gauss x10", "gauss x300")}, table
    assert rows[("128x4x256x128", "gauss x300")] == ["780", "1500", "600", "520"]
    assert "unparsed" not in res.stdout
