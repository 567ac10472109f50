"""docker/start_dockerd.sh writes root's log only where nobody else can plant a symlink (issue 38, item 13).

The script runs as root with a stand-in `docker` (no daemon answers until `dockerd` has started) and a
stand-in `dockerd` (writes a line to its log and its pid file): what is checked is where the script
writes, not Docker. A symlink planted at the old fixed log path (/tmp/clipbert-dockerd.log), at the log
file itself or at its folder, or a log folder others can write to, is never followed: the file it points
at keeps its content. Needs root (the script refuses to start a daemon otherwise).
"""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docker/start_dockerd.sh"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="start_dockerd.sh starts a daemon only as root")
VICTIM_TEXT = "precious\n"


@pytest.fixture
def fakes(tmp_path):
    """A PATH with a `docker` that answers once `dockerd` ran, and that `dockerd`; plus a victim file."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = info ] && [ -f {state}/up ]\n')
    (bin_dir / "dockerd").write_text(
        '#!/bin/sh\necho "dockerd log line"\n'
        'while [ $# -gt 0 ]; do [ "$1" = --pidfile ] && printf 4242 > "$2"; shift; done\n'
        f'touch {state}/up\n')
    for f in ("docker", "dockerd"):
        (bin_dir / f).chmod(0o755)
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    return {"path": f"{bin_dir}:{os.environ['PATH']}", "victim": victim, "tmp": tmp_path}


def _start(fakes, **env):
    full = dict(os.environ, PATH=fakes["path"], DOCKERD_PIDFILE=str(fakes["tmp"] / "dockerd.pid"), **env)
    return subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60, env=full)


def test_the_log_goes_to_a_root_only_folder_and_the_old_tmp_path_is_not_touched(fakes):
    old = Path("/tmp/clipbert-dockerd.log")
    if old.exists() or old.is_symlink():
        pytest.skip(f"{old} exists on this machine; not replacing it")
    log_dir = fakes["tmp"] / "log"  # made by the script: what the default /var/log folder gets
    old.symlink_to(fakes["victim"])
    try:
        p = _start(fakes, DOCKERD_LOG=str(log_dir / "dockerd.log"))
    finally:
        old.unlink()
    assert p.returncode == 0 and p.stdout.strip() == "4242", p.stderr
    assert fakes["victim"].read_text() == VICTIM_TEXT
    assert (log_dir / "dockerd.log").read_text() == "dockerd log line\n"
    assert oct(log_dir.stat().st_mode & 0o777) == "0o700" and log_dir.stat().st_uid == 0
    assert "DOCKERD_LOG=FILE   its log (default /var/log/clipbert-dockerd/dockerd.log)" in SCRIPT.read_text()


def test_a_symlink_planted_at_the_log_file_is_not_followed(fakes):
    log_dir = fakes["tmp"] / "log"
    log_dir.mkdir(mode=0o700)
    (log_dir / "dockerd.log").symlink_to(fakes["victim"])
    p = _start(fakes, DOCKERD_LOG=str(log_dir / "dockerd.log"))
    assert p.returncode == 1 and fakes["victim"].read_text() == VICTIM_TEXT
    assert p.stderr.count("\n") == 1 and "is a symlink: refusing to follow it" in p.stderr, p.stderr
    assert not (fakes["tmp"] / "state/up").exists()  # dockerd never started


@pytest.mark.parametrize("setup, message", [
    ("world_writable", "is writable by others, who could plant a symlink"),
    ("symlinked_dir", "is a symlink: refusing to write root's log through it"),
])
def test_a_log_folder_others_could_plant_in_is_refused(fakes, setup, message):
    shared = fakes["tmp"] / "shared"
    shared.mkdir()
    if setup == "world_writable":  # like /tmp: anyone may create the name first
        shared.chmod(0o1777)
        (shared / "dockerd.log").symlink_to(fakes["victim"])
        log = shared / "new.log"  # even a name nobody planted yet: the folder itself is the problem
    else:
        (fakes["tmp"] / "link").symlink_to(shared, target_is_directory=True)
        log = fakes["tmp"] / "link" / "dockerd.log"
    p = _start(fakes, DOCKERD_LOG=str(log))
    assert p.returncode == 1 and message in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert fakes["victim"].read_text() == VICTIM_TEXT and not log.exists()
