"""One retrieval training step of the original ClipBERT and of the project, on the same weights and batch.

Run by tests/test_legacy_numerics.py through the legacy layer with the ClipBERT checkout as the root::

    python -m clipbert_legacy.legacy --root FORK tests/legacy_oracle_step.py MODEL_JSON D2_YAML TOKENIZER \
        OUT_JSON WEIGHTS

ClipBERT's side is its own code: ``ClipBert`` (grid-feature ResNet-50 built by detectron2's config and
``build_model``, its own BERT) with ``ClipBertForVideoTextRetrieval``, its training step's loss
(``model.transformer.calc_loss``, mean) and backward through ``amp.scale_loss``. Its weights (seeded random
init) are saved and loaded into the project's model (``clipbert_legacy.modeling.build.build_model``,
``cnn_type=resnet50``) as a ClipBERT end-to-end checkpoint. Both then take the same batch; the script writes
the two losses, the largest gradient difference (absolute and relative to the gradient's norm) over the
parameters both have, the keys the load did not match, and both models' eval logits on the batch.
"""
import json
import sys

import horovod.torch as hvd
import torch
from apex import amp
from easydict import EasyDict as edict
from src.modeling.e2e_model import ClipBert as ForkClipBert
from src.modeling.modeling import ClipBertForVideoTextRetrieval
from transformers import BertConfig, BertTokenizerFast

from clipbert_legacy.evaluation.retrieval import eval_retrieval
from clipbert_legacy.modeling.build import build_model
from src.tasks.run_video_retrieval import eval_retrieval as fork_eval_retrieval

CAPTIONS = ["a red square moves left", "a blue circle stays still", "a green triangle moves up",
            "a red circle moves down", "a yellow square moves right", "a purple triangle stays"]


def fork_model(model_json, d2_yaml):
    cfg = BertConfig(**json.load(open(model_json)))
    for k, v in dict(num_labels=2, classifier="mlp", cls_hidden_scale=2, loss_type="ce", margin=0.2).items():
        setattr(cfg, k, v)
    return ForkClipBert(cfg, input_format="BGR", detectron2_model_cfg=d2_yaml,
                        transformer_cls=ClipBertForVideoTextRetrieval)


def batch(tokenizer):
    torch.manual_seed(1)
    enc = tokenizer.batch_encode_plus(CAPTIONS, max_length=12, pad_to_max_length=True, return_tensors="pt")
    # 2 videos x 3 captions each (ClipBERT's grouping: n_examples_list), 2 frames of 64x64, normalised
    return {"visual_inputs": torch.randn(2, 2, 3, 64, 64) * 50, "text_input_ids": enc.input_ids,
            "text_input_mask": enc.attention_mask, "n_examples_list": [3, 3],
            "labels": torch.tensor([1, 0, 0, 1, 0, 0])}


def fork_step(model, optimizer, b):
    """ClipBERT's training step for one clip (run_video_retrieval.start_training's loop body)."""
    mini = {k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in b.items() if k != "labels"}
    outputs = model(mini)
    _, loss = model.transformer.calc_loss(outputs["logits"], b["labels"], sample_size=2)
    loss = loss.mean()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    return loss.item()


def project_step(model, b):
    out = model({k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in b.items()})
    out["loss"].backward()
    return out["loss"].item()


def grad_diffs(fork, project):
    """(params compared, fork params with a gradient, max |difference|, ||difference|| / ||fork gradient||
    over all compared parameters as one vector)."""
    fork_grads = {n: p.grad for n, p in fork.named_parameters() if p.grad is not None}
    worst_abs, diff_sq, norm_sq, compared = 0.0, 0.0, 0.0, 0
    for name, p in project.named_parameters():
        if p.grad is None or name not in fork_grads:
            continue
        diff = p.grad - fork_grads[name]
        worst_abs = max(worst_abs, diff.abs().max().item())
        diff_sq += diff.pow(2).sum().item()
        norm_sq += fork_grads[name].pow(2).sum().item()
        compared += 1
    return compared, len(fork_grads), worst_abs, (diff_sq / norm_sq) ** 0.5


def logits(model, b):
    model.eval()
    with torch.no_grad():
        out = model({k: (v.clone() if torch.is_tensor(v) else list(v)) for k, v in b.items()})
    model.train()
    return out["logits"].tolist()


def retrieval_metrics(model, b, evaluate):
    """Six videos, one caption each (as MSRVTT's 1k-A test), every video against every caption with
    ClipBERT's inference score (softmax probability of "match"), evaluated with ``evaluate``."""
    torch.manual_seed(2)
    videos = torch.randn(len(CAPTIONS), 2, 3, 64, 64) * 50
    model.eval()
    scores = []
    with torch.no_grad():
        for v in range(len(CAPTIONS)):
            out = model({"visual_inputs": videos[v:v + 1].clone(),
                         "text_input_ids": b["text_input_ids"].clone(),
                         "text_input_mask": b["text_input_mask"].clone(), "n_examples_list": [len(CAPTIONS)]})
            probs = torch.softmax(out["logits"], dim=1)[:, 1].tolist()
            scores += [{"vid_id": v, "txt_id": t, "score": s} for t, s in enumerate(probs)]
    model.train()
    gt = {t: t for t in range(len(CAPTIONS))}
    metrics = evaluate(scores, gt, {t: {} for t in gt})
    return {d: {k: float(x) for k, x in m.items()} for d, m in metrics.items()}


if __name__ == "__main__":
    model_json, d2_yaml, tokenizer_dir, out_json, weights = sys.argv[1:6]
    hvd.init()  # ClipBERT's grid backbone asks hvd.rank() while it builds
    torch.manual_seed(0)
    fork = fork_model(model_json, d2_yaml)
    torch.save(fork.state_dict(), weights)
    project = build_model(edict(model_config=model_json, tokenizer_dir=tokenizer_dir, cnn_type="resnet50",
                                e2e_weights_path=weights, img_input_format="BGR", task_type="retrieval",
                                loss_type="ce", classifier="mlp", cls_hidden_scale=2))
    summary = project.load_summaries["e2e"]
    optimizer = torch.optim.SGD(fork.parameters(), lr=0.0)
    fork, optimizer = amp.initialize(fork, optimizer, enabled=False, opt_level="O2")
    fork.train()
    project.train()
    b = batch(BertTokenizerFast.from_pretrained(tokenizer_dir))
    result = {"fork_loss": fork_step(fork, optimizer, b), "project_loss": project_step(project, b)}
    compared = grad_diffs(fork, project)
    result["compared"], result["fork_trainable"], result["grad_abs"], result["grad_rel"] = compared
    result["fork_logits"], result["project_logits"] = logits(fork, b), logits(project, b)
    result["load"] = {"missing": summary.missing, "unexpected": summary.unexpected,
                      "mismatched": [list(map(str, m)) for m in summary.mismatched],
                      "ignored": len(summary.ignored), "loaded": len(summary.loaded)}
    result["fork_metrics"] = retrieval_metrics(fork, b, fork_eval_retrieval)
    result["project_metrics"] = retrieval_metrics(project, b, eval_retrieval)
    json.dump(result, open(out_json, "w"))
