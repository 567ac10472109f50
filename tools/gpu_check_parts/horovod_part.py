"""Part 7 of the GPU check: the distributed stack on the GPU, torch.distributed and Horovod with NCCL.

1. a 1-process ``torchrun`` job: the NCCL process group the project's torch backend uses, an allreduce;
2. the Horovod build the driver started in the background after the timed parts (on a GPU node:
   run_scripts/build_horovod_cuda.sh, Horovod 0.28.1 from the bundle's sdist with
   ``HOROVOD_GPU_OPERATIONS=NCCL`` for the local GPU's architecture only; in the CPU dry run:
   run_scripts/install_horovod.sh, which installs the cached Gloo wheel): waited for, its log's tail kept;
3. ``horovodrun -np 1 --gloo`` of _hvd_nccl_worker.py (allreduce + retrieval steps with ``--fp16 1``),
   with Horovod's timeline on, whose operation names show whether the allreduce ran through NCCL.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time

import _common

HERE = os.path.dirname(os.path.abspath(__file__))


def ddp_probe() -> None:
    """Child under torchrun: NCCL (GPU) or gloo (CPU) process group, an allreduce, one JSON line."""
    import torch
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    t0 = time.perf_counter()
    dist.init_process_group("nccl" if cuda else "gloo")
    x = torch.full((4,), float(dist.get_rank() + 1), device="cuda" if cuda else "cpu")
    dist.all_reduce(x)  # the first collective creates the NCCL communicator
    n = dist.get_world_size()
    print(json.dumps({"backend": dist.get_backend(), "size": n, "device": str(x.device),
                      "ok": bool((x.cpu() == n * (n + 1) / 2).all()), "init_s": time.perf_counter() - t0}))
    dist.destroy_process_group()


def torchrun_probe() -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--standalone",
           os.path.abspath(__file__), "--ddp-probe"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=_common.REPO, timeout=120)
    if p.returncode != 0:
        return {"ok": False, "error": (p.stdout + p.stderr)[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def wait_build(work: str) -> dict:
    """The background build's exit status and log tail (waits until it has ended)."""
    rc_file, log = os.path.join(work, "horovod_build.rc"), os.path.join(work, "horovod_build.log")
    if not os.path.isfile(os.path.join(work, "horovod_build.started")):
        raise RuntimeError(f"no Horovod build was started (no {work}/horovod_build.started)")
    t0 = time.time()
    while not os.path.isfile(rc_file):
        time.sleep(2)
    with open(rc_file) as f:
        rc = int(f.read().strip() or -1)
    with open(log, errors="replace") as f:
        tail = f.read().splitlines()[-25:]
    with open(os.path.join(work, "horovod_build.started")) as f:
        how = f.read().strip()
    return {"how": how, "exit": rc, "waited_s": round(time.time() - t0, 1), "log_tail": tail}


def horovodrun() -> list:
    scripts = os.path.join(sysconfig.get_path("scripts"), "horovodrun")
    exe = scripts if os.path.isfile(scripts) else shutil.which("horovodrun")
    if exe is None:
        raise RuntimeError("horovodrun is not installed (the Horovod build above failed?)")
    return [exe]


def run_worker(work: str) -> dict:
    out, timeline = os.path.join(work, "hvd_worker.json"), os.path.join(work, "hvd_timeline.json")
    env = dict(os.environ, HOROVOD_TIMELINE=timeline)
    cmd = horovodrun() + ["-np", "1", "-H", "localhost:1", "--gloo", sys.executable,
                          os.path.join(HERE, "_hvd_nccl_worker.py"), "--out", out]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=_common.REPO, env=env)
    if p.returncode != 0 or not os.path.isfile(out):
        raise RuntimeError(f"horovodrun exited {p.returncode}:\n{(p.stdout + p.stderr)[-2500:]}")
    with open(out) as f:
        res = json.load(f)
    res["wall_s"] = round(time.time() - t0, 1)
    ops = set()
    if os.path.isfile(timeline):
        with open(timeline, errors="replace") as f:
            ops = set(re.findall(r"\b[A-Z][A-Z0-9_]*ALLREDUCE[A-Z0-9_]*\b", f.read()))
    res["timeline_allreduce_ops"] = sorted(ops)
    res["nccl_allreduce_ran"] = any("NCCL" in op for op in ops)
    return res


def main() -> int:
    if "--ddp-probe" in sys.argv:
        ddp_probe()
        return 0
    a = _common.parse(__doc__.split("\n")[0])
    res = _common.Result("horovod", a.result, a.cpu_dry_run)
    work = a.work or os.path.dirname(os.path.abspath(a.result))
    res.save(torchrun=torchrun_probe())
    res.save(build=wait_build(work))
    if res.data["build"]["exit"] != 0:
        return res.finish(False, error="the Horovod build failed (log tail in build.log_tail)")
    hv = run_worker(work)
    res.save(horovodrun=hv)
    ok = res.data["torchrun"]["ok"] and hv["allreduce"]["ok"] and hv["losses_finite"]
    if not a.cpu_dry_run:
        ok = ok and hv["nccl_built"] and hv["nccl_allreduce_ran"]
    return res.finish(ok)


if __name__ == "__main__":
    sys.exit(main())
