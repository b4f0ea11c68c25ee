"""The source distribution builds: `setup.py sdist` carries every source and header the extension is built
from (csrc/: the C core, which setup.py compiles itself, the CUDA kernels, which it lists only where it
builds them, and their headers; setuptools finds none of these on its own, MANIFEST.in names them), the
emulator's sources the tests compile (tests/emu/) and the benchmark scripts the tests import; and no build
output. CI also builds a wheel from this sdist and imports it (.ci/run)."""
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _files_under(rel_dir, exts):
    out = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, rel_dir)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            if f.endswith(exts) or f == "Makefile":
                out.add(os.path.relpath(os.path.join(dirpath, f), ROOT).replace(os.sep, "/"))
    return out


@pytest.fixture(scope="module")
def sdist_names(tmp_path_factory):
    if not os.path.exists(os.path.join(ROOT, "setup.py")):
        pytest.skip("needs the source tree")
    out = tmp_path_factory.mktemp("sdist")
    # egg_info's folder in tmp too: the source tree is left as it was
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out), "sdist", "-d", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "MOK_FORCE_CPU": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    tars = [f for f in os.listdir(out) if f.endswith(".tar.gz")]
    assert len(tars) == 1, tars
    with tarfile.open(os.path.join(out, tars[0])) as t:
        names = t.getnames()
    top = names[0].split("/")[0]  # mok-<version>
    return {n[len(top) + 1:] for n in names if n.startswith(top + "/")}


def test_sdist_carries_every_source_and_header(sdist_names):
    need = _files_under("csrc", (".c", ".h", ".cpp", ".cu", ".cuh"))
    assert any(n.startswith("csrc/core/") and n.endswith(".c") for n in need)  # the walk found the C core
    assert any(n.endswith(".cuh") for n in need) and any(n.endswith(".cu") for n in need)
    missing = sorted(need - sdist_names)
    assert not missing, f"{len(missing)} of csrc's {len(need)} files not in the sdist, e.g. {missing[:8]}"
    for f in ("setup.py", "pyproject.toml", "README.md", "mok/__init__.py", "mok/reference.py"):
        assert f in sdist_names, f


def test_sdist_carries_what_the_tests_read(sdist_names):
    need = _files_under("tests/emu", (".cpp", ".h")) | _files_under("tests", (".py",))
    need |= {f for f in _files_under("benchmarks", (".py",)) if "/results/" not in f and "/out/" not in f}
    assert "tests/emu/quant_emu.cpp" in need and "benchmarks/bench_moe_layer.py" in need
    missing = sorted(need - sdist_names)
    assert not missing, f"not in the sdist: {missing[:8]}"


def test_sdist_has_no_build_output(sdist_names):
    built = sorted(n for n in sdist_names if n.endswith((".so", ".o", ".pyc")))
    assert not built, built[:8]


@pytest.mark.parametrize("defines, ok", [("-DMOK_SM90_FP8_HALF_PIPE=2 -DMOK_SM90_FP8_EPI_TILE=1", True),
                                         ("-O0", False), ("-D", False)])
def test_setup_takes_only_defines_from_mok_nvcc_defines(defines, ok):
    """MOK_NVCC_DEFINES (the opt-in kernel experiments' compile-time switches) takes -DNAME[=VALUE] and refuses
    anything else with a message that names the variable."""
    r = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MOK_FORCE_CPU": "1", "MOK_NVCC_DEFINES": defines})
    if ok:
        assert r.returncode == 0 and r.stdout.strip().endswith("mok"), r.stdout + r.stderr
    else:
        assert r.returncode != 0 and "MOK_NVCC_DEFINES: expected -DNAME" in r.stdout + r.stderr, r.stdout + r.stderr
