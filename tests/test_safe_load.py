"""Pickled files load without running code (issue 38): the restricted .pkl unpickler, torch_load, the
checked numpy stand-ins, and the weights-match check. The entry points are in test_untrusted_files.py."""
import codecs
import os
import pickle
import random
import zipfile

import numpy as np
import pytest
import torch
from numpy._core.multiarray import _reconstruct

from clipbert_legacy.modeling.build import build_model
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.utils import safe_load
from clipbert_legacy.utils.errors import CheckpointError, UnsafeFileError
from clipbert_legacy.utils.load_save import load_state_dict_file
from clipbert_legacy.utils.safe_load import load_pickle_weights, torch_load
from tests.test_modeling import _cfg
from tests.toy_task import ToyTask, toy_cfg


class Payload:
    """Unpickled by a trusting loader, it creates ``marker`` (the acceptance test's payload)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_the_payload_runs_under_a_trusting_loader(tmp_path):
    """The control: plain pickle.load runs it (so the refusals below are what stops it)."""
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps({"model": {"w": Payload(marker)}}))
    assert marker.exists()


def _detectron2_dict():
    model = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
             "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
             "big_endian": np.arange(4, dtype=">i4"), "half": np.ones((2, 0, 3), np.float16),
             "flags": np.array([True, False]), "count": np.int64(7), "scale": np.float32(1.5),
             "names": np.array([b"res2", b"res3"]), "text": np.array(["x", "yz"])}
    return {"model": model, "__author__": "Detectron2 Model Zoo", "matching_heuristics": True}


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_a_detectron2_pkl_loads_with_every_pickle_protocol(tmp_path, protocol):
    want = _detectron2_dict()
    path = tmp_path / "model_final.pkl"
    path.write_bytes(pickle.dumps(want, protocol=protocol))
    got = load_pickle_weights(str(path))
    assert got["__author__"] == want["__author__"] and got["matching_heuristics"] is True
    assert set(got["model"]) == set(want["model"])
    for k, v in want["model"].items():
        g = got["model"][k]
        assert type(g) is type(v) and g.dtype == v.dtype and g.shape == v.shape and np.array_equal(g, v), k
    assert got["model"]["fortran"].flags.f_contiguous


def test_numpy_1x_module_names_load(tmp_path):
    """numpy 1.x (every detectron2 model zoo file) writes numpy.core.multiarray, 2.x numpy._core."""
    data = pickle.dumps({"model": {"w": np.arange(3.0)}, "s": np.float64(2.5)}, protocol=2)
    assert b"numpy._core.multiarray" in data
    path = tmp_path / "np1.pkl"
    path.write_bytes(data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    got = load_pickle_weights(str(path))
    assert np.array_equal(got["model"]["w"], np.arange(3.0)) and got["s"] == 2.5


def test_a_python2_era_pkl_loads(tmp_path):
    """Detectron (Caffe2) files were written by Python 2: arrays' bytes are ``str`` (read as latin-1)."""
    class Py2Array:  # what numpy under Python 2 wrote: _reconstruct(ndarray, (0,), 'b') + str data
        def __init__(self, a):
            self.a = a

        def __reduce__(self):
            from numpy._core.multiarray import _reconstruct
            return _reconstruct, (np.ndarray, (0,), "b"), (1, self.a.shape, self.a.dtype, False,
                                                           self.a.tobytes().decode("latin1"))
    w = np.arange(-3, 3, dtype=np.float32)
    path = tmp_path / "R-50.pkl"
    path.write_bytes(pickle.dumps({"blobs": {"conv1_w": Py2Array(w)}}, protocol=2))
    assert np.array_equal(load_pickle_weights(str(path))["blobs"]["conv1_w"], w)


def test_detectron2_pkl_loads_into_the_cnn(tmp_path):
    """A genuine detectron2-style file (``backbone.*`` names, detector heads to ignore) as
    cnn_weights_path."""
    torch.manual_seed(3)
    src = build_model(_cfg()).cnn.feature.backbone
    model = {f"backbone.{k}": v.numpy() for k, v in src.state_dict().items()}
    model["roi_heads.box_predictor.cls_score.weight"] = np.zeros((2, 4), np.float32)
    path = tmp_path / "grid_feat.pkl"
    path.write_bytes(pickle.dumps({"model": model, "__author__": "grid-feats-vqa",
                                   "matching_heuristics": True}))
    dst = build_model(_cfg(cnn_weights_path=str(path)))
    s = dst.load_summaries["cnn"]
    assert s.missing == ["grid_encoder.0.weight"] and not s.unexpected and not s.mismatched
    for k, v in src.state_dict().items():
        assert torch.equal(dst.cnn.feature.backbone.state_dict()[k], v), k


def test_a_payload_pkl_is_refused_naming_the_file_and_global(tmp_path):
    marker, path = tmp_path / "marker", tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"model": {"w": np.zeros(2), "x": Payload(marker)}}))
    with pytest.raises(UnsafeFileError) as e:
        load_state_dict_file(str(path))
    assert str(path) in str(e.value) and "builtins.exec" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


class _Reduce:
    """Pickles as ``func(*args)`` (then ``__setstate__(state)``): what an attacker writes by hand."""

    def __init__(self, func, args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


HOSTILE = {
    # numpy's own dtype.__setstate__ accepts the flags: a void dtype that says it holds object pointers
    "a void dtype told it holds objects": _Reduce(np.dtype, ("V8", False, True),
                                                  (3, "|", None, None, None, 8, 1, 63)),
    "an object dtype": _Reduce(np.dtype, ("O8", False, True)),
    "a dtype given fields": _Reduce(np.dtype, ("f4", False, True),
                                    (3, "<", None, ("a",), {"a": (np.dtype("f4"), 0)}, 4, 1, 0)),
    # numpy's _reconstruct allocates the shape it is given before any data is read
    "a huge empty array": _Reduce(_reconstruct, (np.ndarray, (2 ** 40,), b"b")),
    "an array claiming more data than it has": _Reduce(
        _reconstruct, (np.ndarray, (0,), b"b"), (1, (2 ** 20,), np.dtype("f4"), False, b"1234")),
    "bytes(n): n zeros": _Reduce(bytes, (2 ** 28,)),
    "a codec other than latin-1": _Reduce(codecs.encode, ("abc", "rot13")),
}


def test_numpy_itself_trusts_the_dtype_state():
    """The control for the first case: numpy's own unpickling makes the dangerous dtype."""
    assert pickle.loads(pickle.dumps(HOSTILE["a void dtype told it holds objects"])).hasobject


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_numpy_pickles_are_refused(tmp_path, case):
    path = tmp_path / "h.pkl"
    path.write_bytes(pickle.dumps({"model": {"w": HOSTILE[case]}}, protocol=4))
    with pytest.raises(CheckpointError) as e:
        load_pickle_weights(str(path))
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


@pytest.mark.parametrize("case", ["a void dtype told it holds objects", "an object dtype",
                                  "a dtype given fields", "a huge empty array",
                                  "an array claiming more data than it has"])
def test_hostile_numpy_in_a_restore_file_is_refused(tmp_path, case):
    """The same stand-ins serve restore files of the previous version (torch's unpickler, numpy allowed)."""
    path = tmp_path / "restore.pt"
    torch.save({"global_step": 1, "rng": [{"numpy": HOSTILE[case]}]}, path)
    with pytest.raises(UnsafeFileError, match=f"{path} was refused: it asks for something beyond tensors"):
        torch_load(str(path), "fix", numpy_arrays=True)


def test_an_object_array_is_refused(tmp_path):
    path = tmp_path / "o.pkl"
    path.write_bytes(pickle.dumps({"model": {"w": np.array([1, "a"], dtype=object)}}))
    with pytest.raises(CheckpointError, match="o.pkl"):
        load_pickle_weights(str(path))


def test_a_pkl_over_the_size_limit_is_refused_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "big.pkl"
    path.write_bytes(pickle.dumps({"model": {"w": np.zeros(1000)}}))
    monkeypatch.setattr(safe_load, "MAX_PICKLE_BYTES", 1000)
    with pytest.raises(UnsafeFileError, match=r"big.pkl is 0.0 GB, more than a .pkl of weights may be"):
        load_pickle_weights(str(path))


def test_a_compressed_torch_archive_is_refused(tmp_path):
    """torch.load inflates a deflated record in memory: 4 MB of zeros from a 5 KB file here."""
    plain, packed = tmp_path / "plain.pt", tmp_path / "packed.pt"
    torch.save({"w": torch.zeros(1000, 1000)}, plain)
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
    assert os.path.getsize(packed) < 20_000
    assert torch.load(packed, weights_only=True)["w"].shape == (1000, 1000)  # what torch alone does
    with pytest.raises(UnsafeFileError, match="packed.pt was refused: its record .* is compressed"):
        torch_load(str(packed), "fix")
    assert torch_load(str(plain), "fix")["w"].shape == (1000, 1000)


def test_torch_load_refuses_a_payload_even_when_torch_is_told_not_to(tmp_path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 overrides only a torch.load that leaves weights_only unset."""
    marker, path = tmp_path / "marker", tmp_path / "model_step_3.pt"
    torch.save({"w": torch.zeros(2), "x": Payload(marker)}, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    refusal = "model_step_3.pt was refused: it asks for the global builtins.exec"
    with pytest.raises(UnsafeFileError, match=refusal):
        torch_load(str(path), "delete it")
    assert not marker.exists()
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        torch.load(path)  # the control: torch's default is overridden, and the payload runs
    assert marker.exists()


def test_a_restore_file_of_the_previous_version_loads(tmp_path):
    """Older restore files pickled numpy's RNG state (an ndarray): admitted with numpy_arrays=True only,
    rebuilt exactly, and resumable with set_rng_states."""
    from clipbert_legacy.utils.misc import get_rng_states, set_rng_states
    np.random.seed(5)
    random.seed(5)
    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    path = tmp_path / "restore.pt"
    torch.save({"global_step": 3, "rng": [old]}, path)
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    assert "numpy._core.multiarray._reconstruct" in unsafe
    with pytest.raises(UnsafeFileError, match="numpy._core.multiarray._reconstruct"):
        torch_load(str(path), "fix")
    state = torch_load(str(path), "fix", numpy_arrays=True)
    got = state["rng"][0]["numpy"]
    assert got[0] == "MT19937" and got[1].dtype == np.uint32 and np.array_equal(got[1], old["numpy"][1])
    draws = np.random.rand(3)
    set_rng_states(state["rng"][0])
    assert np.array_equal(np.random.rand(3), draws)
    new = get_rng_states()  # what the project writes now: plain values
    torch.save({"rng": [new]}, path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []


def test_a_weights_file_that_fits_nothing_is_an_error(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"encoder.layer.0.weight": torch.zeros(3), "head.bias": torch.zeros(1)}, path)
    with pytest.raises(CheckpointError) as e:
        build_model(_cfg(cnn_weights_path=str(path)))
    msg = str(e.value)
    assert msg.startswith(f"cnn_weights_path {path} does not fit this model: 0 of the model's")
    assert "encoder.layer.0.weight" in msg and "feature.backbone." in msg
    assert "--allow_unmatched_weights 1" in msg
    model = build_model(_cfg(cnn_weights_path=str(path), allow_unmatched_weights=True))
    assert model.load_summaries["cnn"].loaded == []


def test_a_weights_file_fitting_a_small_part_is_an_error(tmp_path):
    torch.manual_seed(0)
    sd = build_model(_cfg()).state_dict()
    few = dict(list(sd.items())[:5])
    path = tmp_path / "few.pt"
    torch.save(few, path)
    with pytest.raises(CheckpointError, match=rf"e2e_weights_path {path} does not fit this model: 5 of the "):
        build_model(_cfg(e2e_weights_path=str(path)))
    torch.save(sd, path)
    assert len(build_model(_cfg(e2e_weights_path=str(path))).load_summaries["e2e"].loaded) == len(sd)


class _NumpyNoiseTask(ToyTask):
    """The toy task with a loss weight drawn from numpy and python ``random`` in the training process
    (data loading has per-sample seeds): a resume is only bitwise when those RNG states come back."""

    def forward_train(self, model, batch, cfg):
        weight = 1.0 + 0.1 * np.random.rand() + 0.1 * random.random()
        return super().forward_train(model, batch, cfg) * weight


class _CrashAt(Hook):
    def after_step(self, trainer, result):
        if trainer.global_step == 5:
            raise KeyboardInterrupt("simulated crash")


def _as_previous_version(restore, numpy_state=None):
    """Rewrite ``restore`` as the previous version wrote it: numpy's RNG state as numpy's own tuple."""
    state = torch.load(restore, weights_only=True)
    for rng in state["rng"]:
        n = rng["numpy"]
        rng["numpy"] = numpy_state or ("MT19937", np.asarray(n["key"], np.uint32), n["pos"], n["has_gauss"],
                                       n["gauss"])
    torch.save(state, restore)
    assert "numpy.ndarray" in torch.serialization.get_unsafe_globals_in_checkpoint(restore)
    return state["global_step"]


@pytest.mark.parametrize("fp16", [0, 1])
def test_a_restore_file_of_the_previous_version_resumes_bitwise(tmp_path, fp16):
    opts = dict(train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2,
                save_steps_ratio=0.25, dist_backend="torch", fp16=fp16)
    u = Trainer(toy_cfg(tmp_path / "u", **opts), _NumpyNoiseTask()).train()
    T, finals = u["global_step"], {}
    for name, other_state in (("r", None), ("control", np.random.RandomState(123).get_state())):
        with pytest.raises(KeyboardInterrupt):
            Trainer(toy_cfg(tmp_path / name, **opts), _NumpyNoiseTask(), hooks=[_CrashAt()]).train()
        resumed_from = _as_previous_version(tmp_path / name / "ckpt" / "restore.pt", other_state)
        assert 0 < resumed_from < T
        resumed = Trainer(toy_cfg(tmp_path / name, **opts), _NumpyNoiseTask()).train()
        assert resumed["global_step"] == T and (name != "r" or resumed == u)
        finals[name] = torch.load(tmp_path / name / "ckpt" / f"model_step_{T}.pt", weights_only=True)
    want = torch.load(tmp_path / "u" / "ckpt" / f"model_step_{T}.pt", weights_only=True)
    assert all(torch.equal(want[k], finals["r"][k]) for k in want)
    assert not all(torch.equal(want[k], finals["control"][k]) for k in want)  # numpy's state did matter
