"""Run the original ClipBERT, unmodified, through the legacy layer: every task script x every launcher.

Each of ClipBERT's task scripts trains a few steps on the demo data in ClipBERT's formats with a config in
ClipBERT's format (``clipbert_legacy.preprocessing.clipbert_format``), runs its own validation, and, where
the script has one, its inference mode on the saved checkpoint. The launchers: one process, ``horovodrun
-np 2``, ``torchrun --nproc_per_node 2``, and one process with ``--fp16 1`` (amp O2 on the CPU). All with
``--cpu`` (ClipBERT is CUDA-only code). Prints one line per run (status, seconds, ClipBERT's own metric
line) and exits 1 if any run failed.

    python tools/legacy_clipbert_matrix.py [--fork DIR] [--work_dir DIR] [--launchers python,horovodrun,...]
        [--cases ret,ret_infer,...]

``--fork`` defaults to ``$CLIPBERT_FORK_DIR`` or ``../shared/legacy_forks/ClipBERT-a118b02`` from the
repository root. The suite runs a subset (tests/test_legacy_clipbert.py); this is the whole matrix.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FORK = REPO.parent / "shared" / "legacy_forks" / "ClipBERT-a118b02"
LAUNCHERS = ("python", "horovodrun", "torchrun", "fp16")


def fork_dir() -> Path:
    return Path(os.environ.get("CLIPBERT_FORK_DIR") or DEFAULT_FORK).resolve()


@dataclass(frozen=True)
class Case:
    """One ClipBERT run: its script, its config (a ``clipbert_format`` name), extra arguments, the run
    whose checkpoint an inference case loads (``infer_of``) and its test file (relative to the work dir)."""
    script: str
    config: str
    args: tuple = ()
    infer_of: str | None = None
    test_txt: str | None = None


CASES = {
    "ret": Case("src/tasks/run_video_retrieval.py", "ret"),
    "ret_infer": Case("src/tasks/run_video_retrieval.py", "ret", infer_of="ret",
                      test_txt="data/txt/retrieval_test.jsonl"),
    "qa_frameqa": Case("src/tasks/run_video_qa.py", "qa_frameqa"),
    "qa_frameqa_infer": Case("src/tasks/run_video_qa.py", "qa_frameqa", infer_of="qa_frameqa",
                             test_txt="data/txt/frameqa_test.jsonl"),
    "qa_action": Case("src/tasks/run_video_qa.py", "qa_action"),
    "mc": Case("src/tasks/run_msrvtt_mc.py", "mc", infer_of="ret"),
    "vqa": Case("src/tasks/run_vqa.py", "vqa", ("--train_batch_size", "4")),
    "vqa_infer": Case("src/tasks/run_vqa.py", "vqa", infer_of="vqa", test_txt="configs/vqa_test.jsonl"),
    "pretrain": Case("src/pretrain/run_pretrain.py", "pretrain"),
}
METRIC_LINE = re.compile(r"validation finished in .*")


def prepare(work_dir: Path) -> dict[str, Path]:
    """Demo data (8 train / 4 val / 4 test videos, VQA frames) and ClipBERT configs under ``work_dir``."""
    from clipbert_legacy.preprocessing.clipbert_format import write_clipbert_configs
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    from clipbert_legacy.preprocessing.make_demo_vqa import build_demo_vqa
    data = work_dir / "data"
    if not (data / "vis_db").is_dir():
        build_demo_data(str(data), n_train=8, n_val=4, n_test=4, img_size=64, n_frames=6, fps=10,
                        num_workers=1, log=lambda *a: None)
        build_demo_vqa(str(data), log=lambda *a: None)
    return write_clipbert_configs(data, work_dir / "configs", work_dir / "runs")


def latest_step(run_dir: Path) -> int:
    steps = [int(p.stem.split("_")[-1]) for p in (run_dir / "ckpt").glob("model_step_*.pt")]
    if not steps:
        raise FileNotFoundError(f"{run_dir}/ckpt has no model_step_*.pt: run the training case first")
    return max(steps)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(case: Case, launcher: str, configs: dict[str, Path], work_dir: Path, fork: Path,
            out_name: str) -> list[str]:
    """The argv of one run (launcher prefix + the layer's launcher + ClipBERT's script and arguments)."""
    runs = work_dir / "runs"
    args = ["--config", str(configs[case.config]), *case.args]
    if case.infer_of is not None:
        source = runs / out_name  # the training run of the same launcher
        args += ["--do_inference", "1", "--output_dir", str(source),
                 "--inference_model_step", str(latest_step(source))]
        if case.test_txt:
            db = "vqa_img_db" if case.config == "vqa" else "vis_db"
            args += ["--inference_txt_db", str(work_dir / case.test_txt),
                     "--inference_img_db", str(work_dir / "data" / db)]
    else:
        args += ["--output_dir", str(runs / out_name)]
    if launcher == "fp16":
        args += ["--fp16", "1"]
    layer = ["-m", "clipbert_legacy.legacy", "--cpu", str(fork / case.script), *args]
    py = sys.executable
    if launcher == "horovodrun":
        return [py, "-m", "clipbert_legacy.compat.loopback", "horovodrun", "-np", "2", "-H", "localhost:2",
                "--gloo", py, *layer]
    if launcher == "torchrun":
        return [py, "-m", "clipbert_legacy.compat.loopback", "torchrun", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *layer]
    return [py, *layer]


def run_case(name: str, launcher: str, configs, work_dir: Path, fork: Path, timeout=900):
    """Run one case; returns (returncode, seconds, ClipBERT's last metric line, combined output)."""
    import subprocess
    case = CASES[name]
    suffix = "" if launcher == "python" else f"_{launcher}"
    out_name = (case.infer_of or name) + suffix
    try:
        cmd = command(case, launcher, configs, work_dir, fork, out_name)
    except FileNotFoundError as e:  # an inference case whose training case did not run or failed
        return 1, 0.0, "", str(e)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}"}
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=work_dir, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    metrics = METRIC_LINE.findall(output)
    return proc.returncode, time.monotonic() - start, (metrics[-1] if metrics else ""), output


def failure_excerpt(output: str, n: int = 8) -> list[str]:
    """The first error a rank raised (a launcher's own 'one or more processes exited' comes last), else
    the output's last lines."""
    lines = output.strip().splitlines()
    for i, line in enumerate(lines):
        if re.search(r"\b\w*(Error|Exception)\b", line) and "Horovod detected" not in line \
                and "ChildFailedError" not in line and not line.lstrip().startswith("File "):
            return lines[max(0, i - n + 1):i + 1]
    return lines[-n:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fork", type=Path, default=None,
                   help="the ClipBERT checkout (default: $CLIPBERT_FORK_DIR)")
    p.add_argument("--work_dir", type=Path, default=Path("output/legacy_clipbert_matrix"))
    p.add_argument("--launchers", default=",".join(LAUNCHERS))
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args(argv)
    fork = (args.fork or fork_dir()).resolve()
    if not (fork / "src" / "tasks" / "run_video_retrieval.py").is_file():
        print(f"error: {fork} is not a ClipBERT checkout (set --fork or CLIPBERT_FORK_DIR)", file=sys.stderr)
        return 2
    work_dir = args.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    configs = prepare(work_dir)
    failed = 0
    for launcher in args.launchers.split(","):
        for name in args.cases.split(","):
            rc, seconds, metric, output = run_case(name, launcher, configs, work_dir, fork)
            status = "ok" if rc == 0 else f"FAILED rc={rc}"
            print(f"{launcher:10s} {name:17s} {status:14s} {seconds:6.1f}s  {metric[:150]}", flush=True)
            if rc != 0:
                failed += 1
                print("    " + "\n    ".join(failure_excerpt(output)), flush=True)
    print(f"{failed} failed" if failed else "all runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
