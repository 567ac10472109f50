"""A stand-in for a lent GPU node, for tests/test_gpu_check_node.py: its package set, a bundle, no index.

The node has Python with torch, numpy, transformers, tokenizers, safetensors, tensorboard, tqdm, pillow,
pytest, psutil and protobuf, and nothing else of the project's. :func:`node_python` gives a fresh
interpreter with exactly that set (CPU torch, this machine's Python): a venv holding the set is built
once and cached under ~/.cache/clipbert-legacy/gpu-node/ (keyed by a hash of its inputs), and every
call returns a new, empty venv that sees it through a ``.pth`` file, so what a test installs into it
(the bundle, Horovod) never reaches the cache. :func:`bundle` is run_scripts/gpu_bundle.sh's bundle for
this machine's Python (cached the same way; apex from ``$GPU_CHECK_TEST_APEX_SRC`` where set, else none).
"""
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "clipbert-legacy" / "gpu-node"
# the node's packages (docs/gpu_check.md), at the versions requirements.txt pins where it pins them
NODE_PACKAGES = ("torch==2.13.0", "numpy==2.4.6", "transformers==5.24.0", "tokenizers==0.23.3",
                 "safetensors==0.8.0", "tensorboard==2.21.0", "tqdm==4.70.1", "pillow==13.0.0",
                 "pytest==9.2.0", "psutil==7.2.2", "protobuf==7.36.2")
PY_TAG = "{}.{}".format(*sys.version_info[:2])


def _key(*parts) -> str:
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:12]


def _base_python() -> str:
    """This machine's interpreter (the one a venv running the tests was made from)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{PY_TAG}" / "site-packages"


def node_venv() -> Path:
    """The cached venv with the node's package set (built on first use: a few minutes)."""
    venv = CACHE / f"venv-py{PY_TAG}-{_key(PY_TAG, *NODE_PACKAGES)}"
    if (venv / ".complete").is_file():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    p = subprocess.run([*pip, *NODE_PACKAGES], capture_output=True, text=True, timeout=1500)
    if p.returncode != 0:
        raise RuntimeError(f"could not build the node venv {venv}:\n{p.stderr[-3000:]}")
    (venv / ".complete").write_text("\n".join(NODE_PACKAGES) + "\n")
    return venv


def node_python(where: Path) -> Path:
    """A new empty venv at ``where`` that sees the cached node venv's packages (its site-packages is
    added as a site dir, behind its own); returns its python."""
    base = node_venv()
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    pth = _site_packages(where) / "_gpu_node_base.pth"
    pth.write_text(f"import site; site.addsitedir({str(_site_packages(base))!r})\n")
    return where / "bin" / "python"


def bundle() -> Path:
    """run_scripts/gpu_bundle.sh's bundle for this Python, cached by the script's hash and the apex source."""
    script = REPO / "run_scripts" / "gpu_bundle.sh"
    apex_src = os.environ.get("GPU_CHECK_TEST_APEX_SRC", "none")
    out = CACHE / f"bundle-py{PY_TAG}-{_key(script.read_text(), PY_TAG, apex_src)}"
    if (out / "bundle.json").is_file():
        return out
    env = dict(os.environ, BUNDLE_PYTHON_VERSION=PY_TAG, APEX_SRC=apex_src, PYTHON=_base_python())
    p = subprocess.run([str(script), "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"gpu_bundle.sh failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return out


def cached_horovod_wheel(python: Path) -> Path | None:
    """The Gloo wheel install_horovod.sh caches for this torch and Python, if it was built."""
    probe = "import sys, torch; print(torch.__version__.replace('+', '_'), '%d%d' % sys.version_info[:2])"
    torch_tag, py = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                                   check=True).stdout.split()
    root = Path(os.environ.get("HOROVOD_WHEEL_CACHE", CACHE.parent / "horovod"))
    found = sorted(root.glob(f"0.28.1-torch{torch_tag}-py{py}-cuda0/horovod-*.whl"))
    return found[-1] if found else None


def scripts_dir(python: Path) -> str:
    return sysconfig.get_path("scripts", vars={"base": str(python.parent.parent)})
