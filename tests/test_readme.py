"""The README's marked shell blocks run as written (links and the generated config reference:
test_docs.py).

Blocks preceded by ``<!-- readme-test -->`` run in order in one bash session from the repo root,
in a reduced mode: ``$CLIPBERT_OVERRIDES`` (appended to every task's command line by
src/clipbert_legacy/config/) shortens training, so the commands themselves are exactly the documented ones.
"""
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests import mp_utils
from tests.conftest import requires_horovod

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
REDUCED = "--num_train_epochs 1 --data_ratio 0.02 --max_eval_examples 16 --log_interval 5"


def marked_blocks(text):
    return re.findall(r"<!-- readme-test -->\s*```bash\n(.*?)```", text, flags=re.S)


def test_readme_has_the_two_commands():
    text = README.read_text()
    assert "./run_scripts/quickstart.sh" in text and "./run_scripts/test.sh" in text
    assert len(marked_blocks(text)) >= 2


# Idle: 130 s alone, 200 s beside the serial group's jobs; two CPU-bound processes beside that halve its
# share of the cores. Its own limit first, then pytest's.
README_TIMEOUT_S = 1800


@requires_horovod
@pytest.mark.timeout(README_TIMEOUT_S + 120)
def test_marked_shell_blocks_run_as_written():
    for d in ("output/readme_ret", "output/readme_action"):
        shutil.rmtree(REPO / d, ignore_errors=True)
    script = "set -euo pipefail\n" + "\n".join(marked_blocks(README.read_text()))
    env = dict(os.environ, CLIPBERT_OVERRIDES=REDUCED, OMP_NUM_THREADS="1",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    env.pop("PYTHONPATH", None)  # as a user runs them: the installed package, no path settings
    p = mp_utils.run_tree(["bash", "-c", script], README_TIMEOUT_S, env, REPO)
    assert p.returncode == 0, f"README block failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    assert list((REPO / "output/readme_ret").glob("results_retrieval_test/step_*/scores.json"))
    assert list((REPO / "output/readme_ret").glob("mc_results_mc_test/step_*/mc_test_scores.json"))
    assert list((REPO / "output/readme_action").glob("results_action_test/step_*/scores.json"))
