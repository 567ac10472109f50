"""Row-sparse averaging of embedding-table gradients (``row_sparse_allreduce``,
clipbert_legacy.compat.hvd.row_sparse)
under both launchers: the averaged gradients equal the dense allreduce's bit for bit (2 ranks), while
only the rows some rank touched travel; a tied table (a gradient in every row) falls back to dense."""
import json

import pytest

from tests import mp_utils

WORKER = "tests/workers/row_sparse.py"


CASES = ["overlap:1:none", "overlap:2:fp16", "idle:1:none", "tied:1:none"]
JOBS = {}  # launcher -> the one job running every case (the "serial" group keeps them on one worker)


def _reports(launcher, case):
    """The two ranks' reports of ``case`` from the launcher's one job over every case (run once)."""
    if launcher == "horovod" and not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    if launcher not in JOBS:
        run = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
        JOBS[launcher] = run([WORKER, *CASES], timeout=240, env={"DIST_BACKEND": launcher})
    proc = JOBS[launcher]
    out, dec, rows, i = proc.stdout, json.JSONDecoder(), [], 0
    while (i := out.find('{"rank"', i)) >= 0:  # torchrun may interleave the ranks' lines
        obj, end = dec.raw_decode(out, i)
        if obj["case"] == case:
            assert "error" not in obj, f"rank {obj['rank']}, {case}:\n{obj['error']}"
            rows.append(obj)
        i = end
    if sorted(r["rank"] for r in rows) != [0, 1]:
        mp_utils.check(proc)
        raise AssertionError(f"no report of {case} from both ranks:\n{proc.stdout[-3000:]}")
    return rows


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torch"])
@pytest.mark.parametrize("mode,bpps,comp", [("overlap", 1, "none"), ("overlap", 2, "fp16"),
                                            ("idle", 1, "none")])
def test_row_sparse_matches_dense_allreduce(launcher, mode, bpps, comp):
    for r in _reports(launcher, f"{mode}:{bpps}:{comp}"):
        assert r["same_weights"]
        for step, s in enumerate(r["steps"]):
            assert s["same"], (step, s)
            assert not s["dense"]
            # the union of both ranks' rows: 60 + 7*(bpps-1) each, 20 + 7*(bpps-1) shared ...
            per_rank = 60 + 7 * (bpps - 1)
            expect = 2 * per_rank - max(0, per_rank - 40)
            if mode == "idle" and step == 1:
                expect = per_rank  # rank 1 did not touch the table: rank 0's rows only
            assert s["rows"] == expect, (step, s)
            assert s["nonzero_rows"] == expect  # exactly the rows with a non-zero average


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torch"])
def test_tied_table_falls_back_to_dense(launcher):
    for r in _reports(launcher, "tied:1:none"):
        assert r["same_weights"]
        assert all(s["same"] and s["dense"] and s["rows"] == 3000 for s in r["steps"])


def test_engine_picks_the_word_embedding_table_only():
    """``embedding_tables`` (what the engine passes as ``row_sparse``): BERT's word embeddings, not the
    position/token-type tables nor a frozen table; a table tied to an MLM decoder is still picked
    (its reduction then takes the dense branch, tested above)."""
    import torch

    from clipbert_legacy.modeling.build import build_model
    from clipbert_legacy.optimization.param_groups import embedding_tables
    from tests.test_modeling import _cfg

    model = build_model(_cfg())
    names = {id(p): n for n, p in model.named_parameters()}
    picked = [names[id(p)] for p in embedding_tables(model)]
    assert len(picked) == 1 and picked[0].endswith("word_embeddings.weight"), picked
    for p in embedding_tables(model):
        p.requires_grad_(False)
    assert embedding_tables(model) == []
    assert embedding_tables(torch.nn.Embedding(512, 4)) == []  # position-sized tables stay dense
