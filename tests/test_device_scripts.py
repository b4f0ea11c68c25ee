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
