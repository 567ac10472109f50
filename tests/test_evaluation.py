"""Retrieval / QA / MC metrics on hand-computed examples (ties, several captions per video)."""
import json
import random

import numpy as np
import pytest
import torch

from clipbert_legacy.evaluation.mc import eval_mc, format_mc_accuracy, gather_mc_predictions, mc_predict
from clipbert_legacy.evaluation.qa import QA_ANSWER_TYPES, eval_qa, gather_qa_results, qa_scores
from clipbert_legacy.evaluation.retrieval import eval_retrieval, gather_retrieval_results


def scores(matrix, txt_ids, vid_ids):
    return [{"txt_id": t, "vid_id": v, "score": matrix[i][j]}
            for i, t in enumerate(txt_ids) for j, v in enumerate(vid_ids)]


def test_retrieval_one_caption_per_video_with_a_tie():
    S = [[0.9, 0.5, 0.1],
         [0.8, 0.3, 0.3],   # GT v2 ties with v3 -> pessimistic rank 2 (ClipBERT's sort gave 1)
         [0.2, 0.7, 0.6]]
    res = scores(S, ["t1", "t2", "t3"], ["v1", "v2", "v3"])
    gt = {"t1": "v1", "t2": "v2", "t3": "v3"}
    m = eval_retrieval(res, gt, id2data=None)
    assert m["text2video"] == pytest.approx({"r1": 100 / 3, "r5": 100.0, "r10": 100.0, "medianR": 2.0,
                                             "meanR": 2.0})
    assert m["video2text"] == pytest.approx({"r1": 200 / 3, "r5": 100.0, "r10": 100.0, "medianR": 1.0,
                                             "meanR": 5 / 3})
    random.Random(0).shuffle(res)  # order of results does not matter (ties included)
    assert eval_retrieval(res, gt, None) == m


def test_retrieval_several_captions_per_video():
    S = [[0.2, 0.9], [0.8, 0.1], [0.4, 0.6], [0.5, 0.5]]
    res = scores(S, ["t1", "t2", "t3", "t4"], ["v1", "v2"])
    gt = {"t1": "v1", "t2": "v1", "t3": "v2", "t4": "v2"}
    m = eval_retrieval(res, gt, None)
    assert m["text2video"] == pytest.approx({"r1": 50.0, "r5": 100.0, "r10": 100.0, "medianR": 1.5,
                                             "meanR": 1.5})
    # v1: best GT caption t2 (0.8) is first; v2: best GT t3 (0.6) is behind t1 (0.9)
    assert m["video2text"] == pytest.approx({"r1": 50.0, "r5": 100.0, "r10": 100.0, "medianR": 1.5,
                                             "meanR": 1.5})


def test_retrieval_r5_r10_and_no_rounding():
    n = 12
    vids = [f"v{j}" for j in range(n)]
    # text i's GT video is v0 and it sits at rank i (scores strictly decreasing by rank, tiny gaps)
    res = []
    for i in range(n):
        order = [v for v in vids if v != "v0"]
        order.insert(i, "v0")
        res += [{"txt_id": f"t{i}", "vid_id": v, "score": 0.5 - 1e-6 * r} for r, v in enumerate(order)]
    gt = {f"t{i}": "v0" for i in range(n)}
    t2v = eval_retrieval(res, gt, None)["text2video"]
    assert t2v == pytest.approx({"r1": 100 / 12, "r5": 500 / 12, "r10": 1000 / 12, "medianR": 6.5,
                                 "meanR": 6.5})


def test_retrieval_duplicates_first_wins_and_missing_scores_error():
    res = scores([[0.9, 0.1], [0.2, 0.8]], ["a", "b"], ["x", "y"])
    m = eval_retrieval(res + [{"txt_id": "a", "vid_id": "y", "score": 5.0}], {"a": "x", "b": "y"}, None)
    assert m["text2video"]["r1"] == 100.0
    with pytest.raises(ValueError, match="text 'b' was not scored against every video"):
        eval_retrieval(res[:-1], {"a": "x", "b": "y"}, None)
    with pytest.raises(ValueError, match="text 'b' has no ground-truth video"):
        eval_retrieval(res, {"a": "x"}, None)


def test_gather_single_process():
    assert gather_retrieval_results([{"txt_id": 1}]) == [{"txt_id": 1}]
    assert gather_qa_results([{"question_id": 1, "answer": 2}] * 2) == [{"question_id": 1, "answer": 2}]
    assert gather_mc_predictions({"q": 1}) == {"q": 1}


def test_all_gather_list_returns_fresh_copies_in_one_process():
    """ClipBERT's utils.distributed.all_gather_list pickled the data and unpickled every rank's entry,
    so even the caller's own entry is a copy (editing the result never edits the input);
    any_broadcast did the same on the root."""
    from clipbert_legacy.utils.distributed import all_gather_list, any_broadcast
    data = {"preds": [1, 2], "n": 3}
    (mine,) = all_gather_list(data)
    assert mine == data and mine is not data and mine["preds"] is not data["preds"]
    mine["preds"].append(9)
    assert data == {"preds": [1, 2], "n": 3}
    got = any_broadcast(data, 0)
    assert got == data and got is not data


def test_qa_overall_and_per_type():
    label2ans = {0: "dog", 1: "cat", 2: "red"}
    gts = {1: {"answer": "dog", "answer_type": "what"}, 2: {"answer": "cat", "answer_type": "what"},
           3: {"answer": "red", "answer_type": "color"}, 4: {"answer": "dog", "answer_type": "what"}}
    preds = [{"question_id": 1, "answer": 0}, {"question_id": 2, "answer": 0},
             {"question_id": 3, "answer": 2}, {"question_id": 4, "answer": 0},
             {"question_id": 4, "answer": 1}]  # padded duplicate: first wins
    m = eval_qa(preds, gts, label2ans=label2ans)
    assert m["overall_acc"] == pytest.approx(75.0)
    assert m["what_acc"] == pytest.approx(200 / 3) and m["color_acc"] == 100.0
    assert m["ratios"] == {"color_ratio": [25.0, 1], "what_ratio": [75.0, 3]}
    with pytest.raises(ValueError, match="question_id 9 has no ground truth"):
        eval_qa([{"question_id": 9, "answer": 0}], gts, label2ans)


def _clipbert_scores_oracle(pred_answers, gt_answers, gt_types, type_order):
    """ClipBERT's numbers for one process, step by step: evaluate_tgif_qa (np.mean over numpy arrays,
    0 for an empty type, ratios [fraction, count]) then run_video_qa.validate's gathering (acc * n
    summed over ranks, / n_ex, get_rounded_percentage = round(x * 100, 2); ratios first)."""
    preds, gts, types = np.array(pred_answers), np.array(gt_answers), np.array(gt_types)
    metrics = {"overall_acc": float(np.mean(preds == gts))}
    counts = {}
    for t in type_order:
        corr = preds[types == t] == gts[types == t]
        metrics[f"{t}_acc"] = float(np.mean(corr)) if len(corr) != 0 else 0
        counts[f"{t}_ratio"] = len(corr)
    n_ex = len(preds)
    out = {}
    if type_order:
        out["ratios"] = {k: [round(1. * c / n_ex * 100, 2), c] for k, c in counts.items()}
    for k, v in metrics.items():
        if "overall" in k:
            out[k] = round((0 + v * n_ex) * 1. / n_ex * 100, 2)
        else:
            num = counts[k.replace("acc", "ratio")]
            g = 0 + v * num
            out[k] = round((g * 1. / num if num != 0 else 0) * 100, 2)
    return out


def test_qa_scores_json_byte_identical_to_clipbert():
    """ClipBERT's dataset_video_qa.VideoQADataset.evaluate_tgif_qa + run_video_qa.validate: scores.json
    (json.dumps(indent=4)) is ``{"ratios": {type_ratio: [round(100 * count / n, 2), count]},
    "overall_acc": round(100 * acc, 2), type_acc...}`` with every answer type of the task in ClipBERT's
    order, an empty one as 0 / [0.0, 0]; the float steps matter (23/160 is 14.37 there, not 14.38)."""
    types = QA_ANSWER_TYPES["frameqa"]
    rng = np.random.default_rng(0)
    gt_types = ["object"] * 160 + ["color"] * 61 + ["number"] * 3
    gt_answers = [f"a{i % 7}" for i in range(len(gt_types))]
    ok = np.zeros(len(gt_types), bool)
    ok[rng.choice(160, 23, replace=False)] = True  # 23 of 160 object questions right
    ok[160 + rng.choice(61, 40, replace=False)] = True
    pred_answers = [a if good else "wrong" for a, good in zip(gt_answers, ok)]
    preds = [{"question_id": i, "answer": a} for i, a in enumerate(pred_answers)]
    gts = {i: {"answer": a, "answer_type": t} for i, (a, t) in enumerate(zip(gt_answers, gt_types))}
    got = qa_scores(preds, gts, answer_types=types)
    want = _clipbert_scores_oracle(pred_answers, gt_answers, gt_types, types)
    assert json.dumps(got, indent=4) == json.dumps(want, indent=4)
    assert list(got) == ["ratios", "overall_acc", "object_acc", "number_acc", "color_acc", "location_acc"]
    assert got["object_acc"] == 14.37 and got["location_acc"] == 0
    assert got["ratios"]["location_ratio"] == [0.0, 0]
    assert got["ratios"]["object_ratio"] == [71.43, 160]
    # action/transition: overall accuracy only; label indices through label2ans for open-ended tasks
    mc = qa_scores([{"question_id": 0, "answer": 3}, {"question_id": 1, "answer": 1}],
                   {0: {"answer": 3}, 1: {"answer": 4}})
    assert json.dumps(mc, indent=4) == json.dumps({"overall_acc": 50.0}, indent=4)
    oe = qa_scores([{"question_id": 0, "answer": 1}], {0: {"answer": "cat", "answer_type": "who"}},
                   label2ans={1: "cat"}, answer_types=QA_ANSWER_TYPES["msrvtt_qa"])
    assert list(oe["ratios"]) == ["what_ratio", "who_ratio", "how_ratio", "where_ratio", "when_ratio"]
    assert oe["who_acc"] == 100.0 and oe["what_acc"] == 0


def test_qa_multiple_choice_indices():
    m = eval_qa([{"question_id": "a", "answer": 3}, {"question_id": "b", "answer": 1}],
                {"a": {"answer": 3}, "b": {"answer": 4}})
    assert m == {"overall_acc": 50.0}


def test_mc_accuracy_with_mixed_id_types():
    logits = torch.tensor([[0.1, 0.9, 0, 0, 0], [2.0, 0, 0, 0, 1.0], [0, 0, 0, 0, 3.0]])
    pred = dict(zip([1, 2, 3], mc_predict(logits)))
    assert pred == {1: 1, 2: 0, 3: 4}
    assert mc_predict(logits.reshape(-1)) == [1, 0, 4]
    m = eval_mc(pred, {"1": 1, "2": 3, "3": 4})  # str keys after a JSON round trip
    assert m["mc_accuracy"] == pytest.approx(200 / 3)
    assert format_mc_accuracy(m["mc_accuracy"]) == "66.67"
