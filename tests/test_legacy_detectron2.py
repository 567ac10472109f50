"""The legacy layer's detectron2 stand-in (clipbert_legacy.legacy.shims.detectron2), imported under its
project name: config files with ``_BASE_``, ``build_model`` over the project's ResNet with detectron2's keys,
``DetectionCheckpointer`` over the safe loaders, comm / logger / structures / data, and one clear error for
every detector use."""
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from clipbert_legacy.legacy.shims._unsupported import NotProvidedError
from clipbert_legacy.legacy.shims.detectron2.checkpoint import DetectionCheckpointer
from clipbert_legacy.legacy.shims.detectron2.config import CfgNode, get_cfg
from clipbert_legacy.legacy.shims.detectron2.config.config import ConfigFileError, ConfigKeyError
from clipbert_legacy.legacy.shims.detectron2.modeling import build_model
from clipbert_legacy.legacy.shims.detectron2.modeling.roi_heads import ROI_HEADS_REGISTRY, StandardROIHeads
from clipbert_legacy.modeling.backbone import ResNet
from clipbert_legacy.utils.errors import CheckpointError, UnsafeFileError

_DEFAULT_FORK = Path(__file__).resolve().parents[2] / "shared" / "legacy_forks" / "ClipBERT-a118b02"
FORK = Path(os.environ.get("CLIPBERT_FORK_DIR", _DEFAULT_FORK))

# ClipBERT's grid model (Base-RCNN-grid.yaml), at the width of the project's "tiny" ResNet preset
GRID_YAML = """\
MODEL:
  META_ARCHITECTURE: "GeneralizedRCNN"
  DEVICE: "cpu"
  RESNETS:
    DEPTH: 50
    OUT_FEATURES: ["res5"]
    STEM_OUT_CHANNELS: 8
    WIDTH_PER_GROUP: 4
    RES2_OUT_CHANNELS: 16
  RPN:
    IN_FEATURES: ["res5"]
  ROI_HEADS:
    NAME: "StandardROIHeads"
    IN_FEATURES: ["res5"]
    NUM_CLASSES: 5
  ROI_BOX_HEAD:
    NAME: "FastRCNNConvFCHead"
    NUM_FC: 2
    FC_DIM: 32
    POOLER_RESOLUTION: 1
  BACKBONE:
    FREEZE_AT: 0
VERSION: 2
"""


def _grid_cfg(tmp_path, extra=None):
    path = tmp_path / "grid.yaml"
    path.write_text(GRID_YAML)
    cfg = get_cfg()
    cfg.merge_from_file(str(path))
    if extra:
        cfg.merge_from_list(extra)
    return cfg


def _one_line(exc_info):
    text = str(exc_info.value)
    assert "\n" not in text, text
    return text


# ---------------------------------------------------------------------------------------------------- config
def test_get_cfg_has_detectron2s_defaults():
    cfg = get_cfg()
    assert isinstance(cfg, CfgNode) and cfg.VERSION == 2
    assert cfg.MODEL.META_ARCHITECTURE == "GeneralizedRCNN" and cfg.MODEL.ROI_HEADS.NAME == "Res5ROIHeads"
    assert cfg.MODEL.RESNETS.OUT_FEATURES == ["res4"] and cfg.MODEL.RESNETS.NORM == "FrozenBN"
    assert cfg.MODEL.PIXEL_MEAN == [103.530, 116.280, 123.675] and cfg.INPUT.MIN_SIZE_TRAIN == (800,)
    assert cfg.MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS == (10.0, 10.0, 5.0, 5.0)
    assert cfg.SOLVER.WARMUP_FACTOR == 0.001 and cfg.MODEL.ANCHOR_GENERATOR.SIZES == [[32, 64, 128, 256, 512]]
    assert get_cfg() is not get_cfg()  # a fresh copy each time


def test_base_files_merge_relative_to_the_including_file(tmp_path):
    (tmp_path / "bases").mkdir()
    (tmp_path / "bases" / "root.yaml").write_text(
        "MODEL:\n  RESNETS:\n    DEPTH: 101\n    OUT_FEATURES: ['res5']\n"
        "  ROI_HEADS:\n    NUM_CLASSES: 1600\n"
        "SOLVER:\n  STEPS: (60000, 80000)\n")
    (tmp_path / "bases" / "mid.yaml").write_text("_BASE_: root.yaml\nMODEL:\n  RESNETS:\n    DEPTH: 152\n")
    (tmp_path / "child.yaml").write_text(
        "_BASE_: bases/mid.yaml\nMODEL:\n  RESNETS:\n    DEPTH: 50\n  WEIGHTS: w.pkl\n"
        "INPUT:\n  MIN_SIZE_TRAIN: (600,)\n")
    cfg = get_cfg()
    cfg.merge_from_file(str(tmp_path / "child.yaml"))
    assert cfg.MODEL.RESNETS.DEPTH == 50  # the child wins over both bases
    assert cfg.MODEL.RESNETS.OUT_FEATURES == ["res5"] and cfg.MODEL.ROI_HEADS.NUM_CLASSES == 1600  # from root
    assert cfg.SOLVER.STEPS == (60000, 80000) and cfg.INPUT.MIN_SIZE_TRAIN == (600,)  # strings -> tuples
    assert cfg.MODEL.WEIGHTS == "w.pkl" and cfg.MODEL.RESNETS.NORM == "FrozenBN"  # untouched default kept


def test_merge_from_list_freeze_and_dump_round_trip(tmp_path):
    cfg = _grid_cfg(tmp_path, ["MODEL.RESNETS.RES5_DILATION", "1", "SOLVER.BASE_LR", "0.02"])
    assert cfg.MODEL.RESNETS.RES5_DILATION == 1 and cfg.SOLVER.BASE_LR == 0.02
    cfg.MODEL.ATTRIBUTE_ON = True  # a fork's own key (ClipBERT's add_attribute_config)
    cfg.MODEL.ROI_ATTRIBUTE_HEAD = CfgNode({"FC_DIM": 512})
    cfg.freeze()
    with pytest.raises(AttributeError):
        cfg.MODEL.DEVICE = "cuda"
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(cfg.dump())  # ClipBERT writes detectron2_model_cfg.yaml this way and merges it back
    again = get_cfg()
    again.MODEL.ATTRIBUTE_ON = False
    again.MODEL.ROI_ATTRIBUTE_HEAD = CfgNode({"FC_DIM": 0})
    again.merge_from_file(str(dumped))
    # equal values (tuples come back from YAML as lists, as in detectron2)
    assert yaml.safe_load(again.dump()) == yaml.safe_load(cfg.dump())
    assert again.MODEL.ROI_ATTRIBUTE_HEAD.FC_DIM == 512 and again.SOLVER.BASE_LR == 0.02


def test_unknown_key_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("MODEL:\n  RESNETS:\n    DEPHT: 50\n")
    with pytest.raises(ConfigKeyError) as e:
        get_cfg().merge_from_file(str(path))
    text = _one_line(e)
    assert str(path) in text and "MODEL.RESNETS.DEPHT" in text
    with pytest.raises(ConfigKeyError, match="MODEL.NOPE"):
        get_cfg().merge_from_list(["MODEL.NOPE", "1"])


def test_base_loop_and_old_version_are_one_line(tmp_path):
    (tmp_path / "a.yaml").write_text("_BASE_: b.yaml\n")
    (tmp_path / "b.yaml").write_text("_BASE_: a.yaml\n")
    with pytest.raises(ConfigFileError, match="loops") as e:
        get_cfg().merge_from_file(str(tmp_path / "a.yaml"))
    _one_line(e)
    (tmp_path / "v1.yaml").write_text("VERSION: 1\n")
    with pytest.raises(ConfigFileError, match="VERSION 1"):
        get_cfg().merge_from_file(str(tmp_path / "v1.yaml"))


def test_a_yaml_that_asks_for_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.yaml"
    path.write_text(f"MODEL:\n  WEIGHTS: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigFileError) as e:
        get_cfg().merge_from_file(str(path), allow_unsafe=True)  # detectron2's default; still safe here
    assert str(path) in _one_line(e) and "not plain YAML" in str(e.value)
    assert not marker.exists()


@pytest.mark.skipif(not FORK.is_dir(),
                    reason=f"the original ClipBERT is not at {FORK} (set CLIPBERT_FORK_DIR)")
def test_clipberts_own_detectron2_config_merges(tmp_path):
    cfg = get_cfg()
    cfg.MODEL.ATTRIBUTE_ON = False  # the keys ClipBERT's add_attribute_config adds before merging
    cfg.INPUT.MAX_ATTR_PER_INS = 16
    cfg.merge_from_file(str(FORK / "src" / "configs" / "detectron2_configs" / "R-50-grid.yaml"))
    assert cfg.MODEL.WEIGHTS == "detectron2://ImageNetPretrained/MSRA/R-50.pkl"
    assert cfg.MODEL.ROI_HEADS.NAME == "AttributeStandardROIHeads" and cfg.MODEL.ROI_HEADS.NUM_CLASSES == 1600
    assert cfg.MODEL.RESNETS.RES5_DILATION == 2 and cfg.DATASETS.TEST == ("visual_genome_test",)
    assert cfg.MODEL.RPN.SMOOTH_L1_BETA == pytest.approx(0.1111) and cfg.MODEL.ATTRIBUTE_ON is True


# ----------------------------------------------------------------------------------------------------- model
def test_build_model_backbone_is_the_projects_resnet_key_for_key(tmp_path):
    model = build_model(_grid_cfg(tmp_path)).eval()
    ours = ResNet((3, 4, 6, 3), 8, 4, 16, freeze_at=0).eval()  # ResNet-50's blocks, the "tiny" widths
    got = {k[len("backbone."):]: v for k, v in model.state_dict().items() if k.startswith("backbone.")}
    shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in got.items()} == shapes
    ours.load_state_dict(got)
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        feats = model.backbone(x)
        assert list(feats) == ["res5"] and feats["res5"].shape == (2, 128, 2, 3)
        assert torch.equal(feats["res5"], ours(x))
    shape = model.backbone.output_shape()["res5"]
    assert (shape.channels, shape.stride) == (128, 32)


def test_build_model_has_detectron2s_detector_keys(tmp_path):
    sd = build_model(_grid_cfg(tmp_path)).state_dict()
    heads = {k: tuple(v.shape) for k, v in sd.items() if not k.startswith("backbone.")}
    assert heads == {
        "proposal_generator.anchor_generator.cell_anchors.0": (15, 4),
        "proposal_generator.rpn_head.conv.weight": (128, 128, 3, 3),
        "proposal_generator.rpn_head.conv.bias": (128,),
        "proposal_generator.rpn_head.objectness_logits.weight": (15, 128, 1, 1),
        "proposal_generator.rpn_head.objectness_logits.bias": (15,),
        "proposal_generator.rpn_head.anchor_deltas.weight": (60, 128, 1, 1),
        "proposal_generator.rpn_head.anchor_deltas.bias": (60,),
        "roi_heads.box_head.fc1.weight": (32, 128), "roi_heads.box_head.fc1.bias": (32,),
        "roi_heads.box_head.fc2.weight": (32, 32), "roi_heads.box_head.fc2.bias": (32,),
        "roi_heads.box_predictor.cls_score.weight": (6, 32), "roi_heads.box_predictor.cls_score.bias": (6,),
        "roi_heads.box_predictor.bbox_pred.weight": (20, 32), "roi_heads.box_predictor.bbox_pred.bias": (20,),
    }
    anchors = sd["proposal_generator.anchor_generator.cell_anchors.0"]
    assert torch.equal(anchors[1], torch.tensor([-16.0, -16.0, 16.0, 16.0]))  # size 32, ratio 1
    w = (32 ** 2 / 0.5) ** 0.5
    assert torch.allclose(anchors[0], torch.tensor([-w / 2, -w * 0.25, w / 2, w * 0.25]))  # ratio 0.5


def test_c4_model_puts_res5_in_the_roi_heads(tmp_path):
    cfg = _grid_cfg(tmp_path, ["MODEL.RESNETS.OUT_FEATURES", "['res4']", "MODEL.RPN.IN_FEATURES", "['res4']",
                               "MODEL.ROI_HEADS.IN_FEATURES", "['res4']",
                               "MODEL.ROI_HEADS.NAME", "Res5ROIHeads"])
    model = build_model(cfg)
    sd = model.state_dict()
    assert not any(k.startswith("backbone.res5") for k in sd)
    res5 = {k: tuple(v.shape) for k, v in sd.items() if k.startswith("roi_heads.res5.")}
    assert res5["roi_heads.res5.0.shortcut.weight"] == (128, 64, 1, 1)
    assert "roi_heads.res5.2.conv3.weight" in res5
    assert sd["roi_heads.box_predictor.cls_score.weight"].shape == (6, 128)
    with torch.no_grad():  # a fork's grid features: res4 from the backbone, then the heads' res5
        grid = model.roi_heads.res5(model.backbone(torch.randn(1, 3, 64, 64))["res4"])
    assert grid.shape == (1, 128, 2, 2)


def test_a_forks_roi_heads_subclass_builds_like_clipberts(tmp_path):
    """ClipBERT's AttributeStandardROIHeads skips StandardROIHeads.__init__ and builds its own box head."""
    @ROI_HEADS_REGISTRY.register()
    class ForkROIHeads(StandardROIHeads):
        def __init__(self, cfg, input_shape):
            super(StandardROIHeads, self).__init__(cfg, input_shape)
            self._init_box_head(cfg, input_shape)
            self.extra = torch.nn.Linear(self.box_head.output_shape.channels, 3)

        def get_conv5_features(self, features):
            return features[self.in_features[0]]

    model = build_model(_grid_cfg(tmp_path, ["MODEL.ROI_HEADS.NAME", "ForkROIHeads"]))
    assert isinstance(model.roi_heads, ForkROIHeads) and model.roi_heads.in_features == ["res5"]
    assert model.roi_heads.num_classes == 5 and model.state_dict()["roi_heads.extra.weight"].shape == (3, 32)
    feats = model.backbone(torch.randn(1, 3, 64, 64))
    assert model.roi_heads.get_conv5_features(feats).shape == (1, 128, 2, 2)


def test_frozen_stages_and_bn_norm(tmp_path):
    model = build_model(_grid_cfg(tmp_path, ["MODEL.BACKBONE.FREEZE_AT", "2", "MODEL.RESNETS.NORM", "BN"]))
    b = model.backbone
    assert not any(p.requires_grad for p in b.stem.parameters())
    assert not any(p.requires_grad for p in b.res2.parameters())
    assert all(p.requires_grad for p in b.res3.parameters())
    assert type(b.res2[0].conv1.norm).__name__ == "FrozenBatchNorm2d"  # frozen BN stages, as detectron2
    assert isinstance(b.res3[0].conv1.norm, torch.nn.BatchNorm2d)


@pytest.mark.parametrize("extra, names", [
    (["MODEL.RESNETS.DEPTH", "18"], "MODEL.RESNETS.DEPTH=18"),
    (["MODEL.RESNETS.NUM_GROUPS", "32"], "ResNeXt"),
    (["MODEL.RESNETS.RES5_DILATION", "2"], "RES5_DILATION=2"),
    (["MODEL.RESNETS.NORM", "GN"], "'GN'"),
    (["MODEL.MASK_ON", "True"], "MASK_ON"),
    (["MODEL.META_ARCHITECTURE", "RetinaNet"], "MODEL.META_ARCHITECTURE"),
    (["MODEL.BACKBONE.NAME", "build_resnet_fpn_backbone"], "MODEL.BACKBONE.NAME"),
])
def test_what_is_not_provided_fails_at_build_with_one_line(tmp_path, extra, names):
    with pytest.raises(NotProvidedError) as e:
        build_model(_grid_cfg(tmp_path, extra))
    text = _one_line(e)
    assert names in text and "real detectron2" in text


def test_detector_use_is_one_clear_line(tmp_path):
    from clipbert_legacy.legacy.shims.detectron2.structures import BitMasks, Boxes
    model = build_model(_grid_cfg(tmp_path))
    feats = model.backbone(torch.randn(1, 3, 64, 64))
    calls = {
        "GeneralizedRCNN.forward": lambda: model([{"image": torch.zeros(3, 64, 64)}]),
        "RPN.forward": lambda: model.proposal_generator(None, feats),
        "ROIPooler.forward": lambda: model.roi_heads.box_pooler([feats["res5"]], [Boxes(torch.zeros(1, 4))]),
        "StandardROIHeads.forward": lambda: model.roi_heads(None, feats, []),
        "FastRCNNOutputLayers.inference": lambda: model.roi_heads.box_predictor.inference(None, []),
        "BitMasks": lambda: BitMasks(torch.zeros(1, 4, 4)),
    }
    for name, call in calls.items():
        with pytest.raises(NotProvidedError) as e:
            call()
        assert name in _one_line(e) and "grid-feature path" in str(e.value), name
    # the parts a grid-feature fork runs do run: the box head and predictor are plain layers
    scores, deltas = model.roi_heads.box_predictor(model.roi_heads.box_head(torch.randn(4, 128, 1, 1)))
    assert scores.shape == (4, 6) and deltas.shape == (4, 20)


# ------------------------------------------------------------------------------------------------ checkpoints
def _pair(tmp_path):
    torch.manual_seed(0)
    src = build_model(_grid_cfg(tmp_path))
    torch.manual_seed(1)
    dst = build_model(_grid_cfg(tmp_path))
    key = "backbone.stem.conv1.weight"
    assert not torch.equal(src.state_dict()[key], dst.state_dict()[key])
    return src, dst


def _assert_same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_checkpointer_loads_a_pth_and_returns_the_rest(tmp_path):
    src, dst = _pair(tmp_path)
    path = tmp_path / "model_final.pth"
    torch.save({"model": src.state_dict(), "iteration": 41}, path)
    extra = DetectionCheckpointer(dst).resume_or_load(str(path), resume=False)
    assert extra == {"iteration": 41}
    _assert_same(src, dst)
    torch.manual_seed(2)
    plain = build_model(_grid_cfg(tmp_path))
    torch.save(src.state_dict(), tmp_path / "plain.pth")  # a bare state dict, as ClipBERT saves the CNN
    assert DetectionCheckpointer(plain).load(str(tmp_path / "plain.pth")) == {}
    _assert_same(src, plain)


def test_checkpointer_loads_a_detectron2_pkl(tmp_path):
    src, dst = _pair(tmp_path)
    model = {k: v.numpy() for k, v in src.state_dict().items()}
    path = tmp_path / "grid_feat.pkl"
    path.write_bytes(pickle.dumps({"model": model, "__author__": "grid-feats-vqa",
                                   "matching_heuristics": True}))
    checkpointer = DetectionCheckpointer(dst)
    checkpointer.load(str(path))
    _assert_same(src, dst)
    assert not checkpointer.last_summary.missing and not checkpointer.last_summary.unexpected


_C2_BRANCH = {"shortcut": "1", "conv1": "2a", "conv2": "2b", "conv3": "2c"}


def _c2_name(key):
    """Our backbone key -> the Caffe2 (MSRA R-50.pkl) blob name, for building a test file."""
    parts = key.split(".")
    if parts[0] == "stem":
        return {"weight": "conv1_w", "norm.weight": "res_conv1_bn_s", "norm.bias": "res_conv1_bn_b"}.get(
            ".".join(parts[2:]))
    kind = {"weight": "w", "norm.weight": "bn_s", "norm.bias": "bn_b"}.get(".".join(parts[3:]))
    if kind is None:
        return None
    return f"{parts[0]}_{parts[1]}_branch{_C2_BRANCH[parts[2]]}_{kind}"


def test_checkpointer_renames_caffe2_blobs_and_matches_by_suffix(tmp_path):
    src, dst = _pair(tmp_path)
    blobs = {}
    for k, v in src.backbone.state_dict().items():
        name = _c2_name(k)
        if name:
            blobs[name] = v.numpy()
    blobs["res2_0_branch2a_w_momentum"] = np.full_like(blobs["res2_0_branch2a_w"], 7.0)  # dropped
    blobs["pred_w"] = np.zeros((10, 128), np.float32)  # the ImageNet classifier: not part of the model
    path = tmp_path / "R-50.pkl"
    path.write_bytes(pickle.dumps({"blobs": blobs}, protocol=2))
    checkpointer = DetectionCheckpointer(dst)
    checkpointer.load(str(path))
    got, want = dst.backbone.state_dict(), src.backbone.state_dict()
    for k in want:
        if k.endswith(("running_mean", "running_var")):  # MSRA BN is s*x + b: statistics 0 and 1 - eps
            assert torch.all(got[k] == (0.0 if k.endswith("mean") else 1.0 - 1e-5)), k
        else:
            assert torch.equal(got[k], want[k]), k
    assert "roi_heads.box_predictor.cls_score.weight" in checkpointer.last_summary.missing


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("suffix", [".pkl", ".pth"])
def test_a_hostile_checkpoint_is_refused_and_nothing_runs(tmp_path, suffix):
    marker, path = tmp_path / "ran", tmp_path / f"evil{suffix}"
    model = build_model(_grid_cfg(tmp_path))
    if suffix == ".pkl":
        path.write_bytes(pickle.dumps({"model": {"w": np.zeros(2)}, "x": _Payload(marker)}))
    else:
        torch.save({"model": model.state_dict(), "x": _Payload(marker)}, path)
    with pytest.raises(UnsafeFileError) as e:
        DetectionCheckpointer(model).load(str(path))
    assert str(path) in _one_line(e) and "system" in str(e.value)
    assert not marker.exists()


def test_save_then_resume_restores_model_and_optimizer(tmp_path):
    src, dst = _pair(tmp_path)
    opt = torch.optim.SGD(src.parameters(), lr=0.1, momentum=0.9)
    src.backbone.stem.conv1.weight.sum().backward()
    opt.step()
    DetectionCheckpointer(src, str(tmp_path / "run"), optimizer=opt).save("model_0000009", iteration=9)
    assert (tmp_path / "run" / "last_checkpoint").read_text() == "model_0000009.pth"
    opt2 = torch.optim.SGD(dst.parameters(), lr=0.1, momentum=0.9)
    extra = DetectionCheckpointer(dst, str(tmp_path / "run"), optimizer=opt2).resume_or_load("", resume=True)
    assert extra == {"iteration": 9}
    _assert_same(src, dst)
    assert opt2.state_dict()["state"][0]["momentum_buffer"].shape == src.backbone.stem.conv1.weight.shape


def test_detectron2_urls_come_from_the_cache_or_fail_saying_where(tmp_path, monkeypatch):
    src, dst = _pair(tmp_path)
    monkeypatch.setenv("FVCORE_CACHE", str(tmp_path / "cache"))
    url = "detectron2://ImageNetPretrained/MSRA/R-50.pth"
    with pytest.raises(CheckpointError) as e:
        DetectionCheckpointer(dst).load(url)
    text = _one_line(e)
    assert url in text
    assert "https://dl.fbaipublicfiles.com/detectron2/ImageNetPretrained/MSRA/R-50.pth" in text
    cached = tmp_path / "cache" / "detectron2" / "ImageNetPretrained" / "MSRA" / "R-50.pth"
    cached.parent.mkdir(parents=True)
    torch.save(src.state_dict(), cached)
    DetectionCheckpointer(dst).load(url)
    _assert_same(src, dst)


# ------------------------------------------------------------------------------------- comm, logger, others
def test_comm_on_one_process():
    from clipbert_legacy.legacy.shims.detectron2.utils import comm
    got = (comm.get_world_size(), comm.get_rank(), comm.get_local_rank(), comm.get_local_size())
    assert got == (1, 0, 0, 1)
    assert comm.is_main_process()
    comm.synchronize()
    assert comm.all_gather({"a": 1}) == [{"a": 1}] and comm.gather(5) == [5] and comm.gather(5, dst=1) == []
    d = {"loss": torch.tensor(2.0)}
    assert comm.reduce_dict(d) is d
    assert isinstance(comm.shared_random_seed(), int)


@pytest.mark.multiprocess
def test_comm_under_horovodrun_uses_the_jobs_processes(tmp_path):
    from tests.mp_utils import horovodrun_available, run_horovod
    if not horovodrun_available():
        pytest.skip("horovodrun is not installed in this venv")
    script = tmp_path / "comm_job.py"
    script.write_text(
        "import horovod.torch as hvd\n"
        "hvd.init()\n"
        "import torch\n"
        "from clipbert_legacy.legacy.shims.detectron2.utils import comm\n"
        "got = comm.all_gather(comm.get_rank() * 10)\n"
        "red = comm.reduce_dict({'x': torch.tensor(float(comm.get_rank() + 1))})\n"
        "comm.synchronize()\n"
        "print('RESULT', comm.get_world_size(), comm.get_rank(), got, float(red['x']), flush=True)\n")
    proc = run_horovod([script], np=2, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = sorted(line.split("RESULT ", 1)[1] for line in proc.stdout.splitlines() if "RESULT " in line)
    assert lines == ["2 0 [0, 10] 1.5", "2 1 [0, 10] 1.5"]


def test_setup_logger_writes_per_rank_files_once(tmp_path):
    from clipbert_legacy.legacy.shims.detectron2.utils.logger import setup_logger
    logger = setup_logger(str(tmp_path), distributed_rank=1, name="d2test_rank1")
    assert setup_logger(str(tmp_path), distributed_rank=1, name="d2test_rank1") is logger
    assert len(logger.handlers) == 1  # rank 1: the file only, added once
    logger.info("hello from rank 1")
    for h in logger.handlers:
        h.flush()
    assert "hello from rank 1" in (tmp_path / "log.txt.rank1").read_text()


def test_structures_numbers():
    from clipbert_legacy.legacy.shims.detectron2.structures import Boxes, BoxMode, Instances, pairwise_iou
    assert BoxMode.convert([10, 20, 30, 40], BoxMode.XYWH_ABS, BoxMode.XYXY_ABS) == [10, 20, 40, 60]
    arr = BoxMode.convert(np.array([[10.0, 20, 40, 60]]), BoxMode.XYXY_ABS, BoxMode.XYWH_ABS)
    assert isinstance(arr, np.ndarray) and arr.tolist() == [[10, 20, 30, 40]]
    boxes = Boxes(torch.tensor([[0.0, 0, 10, 10], [5, 5, 25, 15]]))
    assert boxes.area().tolist() == [100, 200]
    assert pairwise_iou(boxes, boxes)[0, 1].item() == pytest.approx(25 / 275)
    boxes.clip((12, 20))
    assert boxes.tensor[1].tolist() == [5, 5, 20, 12]
    inst = Instances((12, 20), gt_boxes=boxes, gt_classes=torch.tensor([3, 7]))
    assert len(inst) == 2 and inst[1].gt_classes.tolist() == [7] and inst.has("gt_boxes")
    with pytest.raises(ValueError, match="length 3"):
        inst.scores = torch.zeros(3)


def test_data_catalogs_samplers_and_dataset_dicts():
    from clipbert_legacy.legacy.shims.detectron2.data import DatasetCatalog, MetadataCatalog, samplers
    from clipbert_legacy.legacy.shims.detectron2.data.build import get_detection_dataset_dicts
    dicts = [{"file_name": "a", "annotations": [{"iscrowd": 0}]}, {"file_name": "b", "annotations": []},
             {"file_name": "c", "annotations": [{"iscrowd": 1}]}]
    DatasetCatalog.register("d2test_split", lambda: dicts)
    with pytest.raises(AssertionError, match="already registered"):
        DatasetCatalog.register("d2test_split", lambda: dicts)
    MetadataCatalog.get("d2test_split").set(json_file="x.json", evaluator_type="coco")
    assert MetadataCatalog.get("d2test_split").json_file == "x.json"
    assert [d["file_name"] for d in get_detection_dataset_dicts(["d2test_split"])] == ["a"]
    assert len(get_detection_dataset_dicts("d2test_split", filter_empty=False)) == 3
    first = list(zip(range(10), samplers.TrainingSampler(4, seed=3)))
    assert sorted(i for _, i in first[:4]) == [0, 1, 2, 3]  # every epoch is a permutation
    assert first == list(zip(range(10), samplers.TrainingSampler(4, seed=3)))
    assert list(samplers.InferenceSampler(5)) == [0, 1, 2, 3, 4]


def test_nms_numbers():
    from clipbert_legacy.legacy.shims.detectron2.layers import batched_nms, nms
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 9]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    assert nms(boxes, scores, 0.5).tolist() == [3, 2]  # 0 overlaps 3 (IoU 0.9), 1 overlaps 3 (IoU 0.66)
    assert nms(boxes, scores, 0.95).tolist() == [3, 0, 1, 2]
    assert batched_nms(boxes, scores, torch.tensor([0, 1, 0, 0]), 0.5).tolist() == [3, 1, 2]


def test_the_stand_in_imports_without_the_real_packages():
    """Nothing in the stand-in imports detectron2 or torchvision (they may be absent or broken)."""
    code = ("import sys; sys.modules['detectron2'] = None; sys.modules['torchvision'] = None\n"
            "import clipbert_legacy.legacy.shims.detectron2.modeling as m\n"
            "import clipbert_legacy.legacy.shims.detectron2.data\n"
            "import clipbert_legacy.legacy.shims.detectron2.checkpoint\n"
            "print(m.build_model.__module__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "clipbert_legacy.legacy.shims.detectron2.modeling.meta_arch.build"


_CLIPBERT_GRID_JOB = """
import importlib, pkgutil, sys, types
import torch
import clipbert_legacy.legacy.shims.detectron2 as d2
# what the layer's finder does: the stand-in's modules under detectron2's names
for m in pkgutil.walk_packages(d2.__path__, d2.__name__ + "."):
    importlib.import_module(m.name)
for name, mod in list(sys.modules.items()):
    if name == d2.__name__ or name.startswith(d2.__name__ + "."):
        sys.modules["detectron2" + name[len(d2.__name__):]] = mod
try:
    import horovod.torch as hvd
except ImportError:
    from clipbert_legacy.compat import hvd
    sys.modules["horovod"] = types.ModuleType("horovod")
    sys.modules["horovod.torch"] = hvd
hvd.init()
sys.path.insert(0, sys.argv[1])  # the fork's repository root: its own top-level `src`
from src.modeling.grid_feat import GridFeatBackbone  # ClipBERT's file, unmodified
from clipbert_legacy.modeling.backbone import GridFeatBackbone as Ours, build_resnet
theirs = GridFeatBackbone(sys.argv[2], types.SimpleNamespace(backbone_channel_in_size=2048, hidden_size=32))
ours = Ours(build_resnet("resnet50"), 32)
own, their_sd = ours.state_dict(), theirs.state_dict()
assert set(own) <= set(their_sd), sorted(set(own) - set(their_sd))[:5]
extra = sorted({k.split(".")[1] for k in set(their_sd) - set(own)})
ours.load_state_dict({k: their_sd[k] for k in own})
theirs.eval(); ours.eval()
x = torch.randn(1, 2, 3, 64, 96)
with torch.no_grad():
    a, b = theirs(x), ours(x)
print("RESULT", type(theirs.feature.roi_heads).__name__, extra, tuple(a.shape), torch.equal(a, b))
"""


@pytest.mark.skipif(not FORK.is_dir(),
                    reason=f"the original ClipBERT is not at {FORK} (set CLIPBERT_FORK_DIR)")
def test_clipberts_own_grid_backbone_runs_on_the_stand_in_and_equals_the_projects(tmp_path):
    """ClipBERT's GridFeatBackbone (its grid_feat.py and grid_feats package, unmodified) builds its detectron2
    model on the stand-in; the project's GridFeatBackbone holds the same keys (but for the detector heads)
    and, given ClipBERT's weights, computes bit-identical grid features."""
    proc = subprocess.run([sys.executable, "-c", _CLIPBERT_GRID_JOB, str(FORK),
                           str(FORK / "src" / "configs" / "detectron2_configs" / "R-50-grid.yaml")],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT")).split(" ", 1)[1]
    assert result == "AttributeStandardROIHeads ['proposal_generator', 'roi_heads'] (1, 2, 1, 1, 32) True"
