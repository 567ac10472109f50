"""Hand this host's pip setup to an image build without it landing in the image.

The legacy builder (Debian's docker.io has no buildx, so no BuildKit secrets or bind mounts) runs RUN steps
that cannot see the host's pip configuration, CA bundle or local wheels. This writes them into
``docker/build_extras/`` (git-ignored; part of the build context): ``pip.conf`` (the host's index URLs that
a container can reach, ``cert`` and ``find-links`` rewritten to the copies below), ``ca.crt`` and
``wheels/`` (the ``*.whl`` and ``*.tar.gz`` of the host's local find-links folders and of ``--wheels``
folders, hard-linked when possible). Only the
Dockerfile's ``env`` stage reads the folder (through docker/with_build_extras.sh); the final stage copies
the sources from a stage that deleted it, so no layer of the image holds it.

    python docker/stage_build_extras.py [--wheels DIR ...] [--no-host-pip] [--no-host-wheels] [--no-index]

Prints one line per item (what was passed, what was left out and why). ``file://`` indexes are left out:
they are folders of this host; put the wheels the build needs in a ``--wheels`` folder instead.
``--no-host-wheels`` leaves out the host's find-links folders (the CUDA image: this host's CPU torch wheel
``torch-2.13.0+cpu`` would win over PyPI's CUDA ``torch-2.13.0``, a local version sorting higher).
``--no-index``: the build installs from the passed wheels only (``no-index = true``): pip prefers an index's
copy of a wheel over the same file in a find-links folder, so with an index the CUDA build would fetch
torch and its NVIDIA libraries (3 GB) again; and the set the host resolved is the set the image gets.
"""
import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

EXTRAS = Path(__file__).resolve().parent / "build_extras"
IN_BUILD = "/tmp/build-extras"  # where the Dockerfile's env stage puts the folder
KEEP = "README.md"


def host_pip_config() -> dict[str, str]:
    """pip's merged configuration (files, then PIP_* variables), keys without their section."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         check=True).stdout
    cfg = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        cfg[key.split(".", 1)[-1]] = value.strip().strip("'\"")
    for key in ("index-url", "extra-index-url", "find-links", "cert", "timeout", "trusted-host"):
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            cfg[key] = env
    return cfg


def _link_or_copy(src: Path, dst: Path):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def stage(cfg: dict[str, str], wheel_dirs: list[str], out: Path = EXTRAS, host_wheels: bool = True,
          index: bool = True) -> list[str]:
    """Write pip.conf / ca.crt / wheels/ into ``out`` (emptied first, README kept); returns the report.
    ``host_wheels=False``: the host's find-links folders are left out (only ``wheel_dirs`` are passed);
    ``index=False``: no index at all, only the wheels."""
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if p.name != KEEP:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    report, lines = [], ["[global]"]
    if not index:
        lines.append("no-index = true")
        report.append("indexes: none (--no-index: the build installs only the wheels passed)")
        cfg = {k: v for k, v in cfg.items() if k not in ("index-url", "extra-index-url")}
    urls = cfg.get("index-url", "").split() + cfg.get("extra-index-url", "").split()
    local = [u for u in urls if not u.startswith(("http://", "https://"))]
    remote = [u for u in urls if u not in local]
    if cfg.get("index-url", "").startswith(("http://", "https://")):
        lines.append(f"index-url = {cfg['index-url']}")
    extra = [u for u in remote if u != cfg.get("index-url")]
    if extra:
        lines.append("extra-index-url = " + " ".join(extra))
    report += [f"index {u}: passed" for u in remote]
    report += [f"index {u}: left out (a folder of this host; pass its wheels with --wheels)" for u in local]
    for key in ("timeout", "trusted-host"):
        if cfg.get(key):
            lines.append(f"{key} = {cfg[key]}")
    cert = cfg.get("cert") or os.environ.get("SSL_CERT_FILE") or os.environ.get("REQUESTS_CA_BUNDLE")
    if cert and Path(cert).is_file():
        shutil.copyfile(cert, out / "ca.crt")
        lines.append(f"cert = {IN_BUILD}/ca.crt")
        report.append(f"CA bundle {cert}: passed")
    host_dirs = [d for d in cfg.get("find-links", "").split() if Path(d).is_dir()]
    if not host_wheels:
        report += [f"find-links {d}: left out (--no-host-wheels)" for d in host_dirs]
        host_dirs = []
    dirs = wheel_dirs + host_dirs
    # wheels, and sdists (Horovod is built from its sdist: with --no-index it must be here too)
    wheels = sorted({w.name: w for d in dirs for pattern in ("*.whl", "*.tar.gz")
                     for w in Path(d).glob(pattern)}.values())
    if wheels:
        (out / "wheels").mkdir()
        for w in wheels:
            _link_or_copy(w, out / "wheels" / w.name)
        lines.append(f"find-links = {IN_BUILD}/wheels")
        report.append(f"{len(wheels)} local wheel(s)/sdist(s) from {', '.join(dirs)}: passed")
    (out / "pip.conf").write_text("\n".join(lines) + "\n")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", action="append", default=[], help="a folder of wheels for the build")
    ap.add_argument("--no-host-pip", action="store_true", help="ignore this host's pip configuration")
    ap.add_argument("--no-host-wheels", action="store_true",
                    help="leave out the host's find-links folders (keep its indexes and CA)")
    ap.add_argument("--no-index", action="store_true", help="no index in the build: only the wheels passed")
    a = ap.parse_args(argv)
    for d in a.wheels:
        if not Path(d).is_dir():
            sys.exit(f"[stage_build_extras] ERROR: --wheels {d}: not a folder")
    cfg = {} if a.no_host_pip else host_pip_config()
    for line in stage(cfg, a.wheels, host_wheels=not a.no_host_wheels, index=not a.no_index):
        print(f"[stage_build_extras] {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
