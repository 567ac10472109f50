"""Retrieval / QA / MC metrics on hand-computed examples (ties, several captions per video)."""
import random

import pytest
import torch

from src.evaluation.mc import eval_mc, format_mc_accuracy, gather_mc_predictions, mc_predict
from src.evaluation.qa import eval_qa, gather_qa_results
from src.evaluation.retrieval import eval_retrieval, gather_retrieval_results


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
    assert m["ratios"] == {"color_ratio": [0.25, 1], "what_ratio": [0.75, 3]}
    with pytest.raises(ValueError, match="question_id 9 has no ground truth"):
        eval_qa([{"question_id": 9, "answer": 0}], gts, label2ans)


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
