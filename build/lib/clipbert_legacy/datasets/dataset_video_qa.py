"""Video QA (TGIF-QA / MSRVTT-QA): open-ended (frameqa, msrvtt_qa) and 5-way (action, transition)."""
import logging

import torch

from clipbert_legacy.config.options import MC_QA, OPEN_ENDED_QA, QA_TASKS  # the option `task`'s choices
from clipbert_legacy.datasets.collate import CollatorBase, stack_visual, tokenize
from clipbert_legacy.datasets.data_utils import flat_list_of_lists
from clipbert_legacy.datasets.dataset_base import VideoDatasetBase

logger = logging.getLogger(__name__)

N_OPTIONS = 5


def mk_qa_examples(raw_rows, task, path="<jsonl>"):
    """jsonl rows -> [{question, vid_id, answer, question_id, options?, answer_type?}].

    The video key is `gif_name`, falling back to `video_id`; question_id = row index (ClipBERT).
    """
    out = []
    for i, r in enumerate(raw_rows):
        d = {"question": r["question"], "vid_id": r["gif_name"] if "gif_name" in r else r["video_id"],
             "answer": r.get("answer"), "question_id": i}
        if task in MC_QA:
            opts = r.get("options")
            if not isinstance(opts, list) or len(opts) != N_OPTIONS:
                raise ValueError(f"{path}: row {i + 1}: task {task} needs 'options' with {N_OPTIONS} "
                                 f"strings, got {opts!r}")
            d["options"] = opts
            answer = d["answer"]
            if answer is not None and not (isinstance(answer, int) and 0 <= answer < N_OPTIONS):
                raise ValueError(f"{path}: row {i + 1}: answer must be an option index 0..4, "
                                 f"got {answer!r}")
        if "answer_type" in r:
            d["answer_type"] = r["answer_type"]
        out.append(d)
    return out


class VideoQADataset(VideoDatasetBase):
    """One item = one video with its question(s) (group size 1 for QA, as ClipBERT forces).

    Args:
        qa_task: frameqa | msrvtt_qa (open-ended, labels via ans2label) | action | transition (5-way).
        datalist: [(vid_id, [example])] from mk_input_group over mk_qa_examples rows.
        ans2label: {answer: label} (open-ended tasks); an answer missing from it gets label -100
            (ignored by cross-entropy, never counted correct) instead of ClipBERT's KeyError.
        return_label: include labels (False: labels None, e.g. unlabeled test files).
        Other args: see VideoDatasetBase. ClipBERT's clips: train `rand` x train_n_clips
            (clip_mode "strategy" if random_sample_clips else "uniform"); eval always "uniform"
            x inference_n_clips (1 clip = the video start).
    Item: {vid, examples [{q_str, question_id, label, options_str_list?, answer_type}], n_examples,
        vid_id, bad_videos}.
    """

    def __init__(self, qa_task, datalist, img_lmdb_dir, ans2label=None, return_label=True, **kw):
        if qa_task not in QA_TASKS:
            raise ValueError(f"task={qa_task!r} is not one of {QA_TASKS}")
        if qa_task in OPEN_ENDED_QA and return_label and not ans2label:
            raise ValueError(f"task {qa_task} needs ans2label (ans2label_path) to build labels")
        kw.setdefault("name", f"{qa_task}_{'train' if kw.get('is_train') else 'eval'}")
        super().__init__(datalist, img_lmdb_dir, **kw)
        self.qa_task, self.ans2label, self.return_label = qa_task, ans2label or {}, return_label
        self.qid2data = {e["question_id"]: e for _, g in datalist for e in g}
        self.n_unknown_answers = 0
        if qa_task in OPEN_ENDED_QA and return_label:
            answers = [e["answer"] for e in self.qid2data.values()]
            unknown = sorted({a for a in answers if a not in self.ans2label})
            self.n_unknown_answers = sum(a not in self.ans2label for a in answers)
            if unknown:
                logger.warning("%s: %d question(s) have answers not in ans2label (label -100), e.g. %s",
                               self.name, self.n_unknown_answers, unknown[:5])

    def __len__(self):
        return len(self.datalist)

    def _example(self, d):
        label = d["answer"]
        if self.return_label and label is not None and self.qa_task in OPEN_ENDED_QA:
            label = self.ans2label.get(label, -100)
        ex = {"q_str": d["question"], "question_id": d["question_id"],
              "label": label if self.return_label else None, "answer_type": d.get("answer_type")}
        if self.qa_task in MC_QA:
            ex["options_str_list"] = d["options"]
        return ex

    def _build(self, index):
        vid_id, examples = self.datalist[index]
        frames, reason = self.try_load_video(vid_id)
        if frames is None:
            return None, (vid_id, reason)
        exs = [self._example(e) for e in examples]
        return {"vid": frames, "examples": exs, "n_examples": len(exs), "vid_id": vid_id}, None

    def __getitem__(self, index):
        return self.load_item(index, self._build)


class VideoQACollator(CollatorBase):
    """Batch for QA: visual_inputs (B, T, 3, S, S); open-ended: text_input_ids/mask (B, L);
    action/transition: (B*5, L) of `q + " " + option_i`; labels (B,) long or None; question_ids;
    answer_types; n_examples_list (1 per question, 5 per question for 5-way); bad_videos.

    Args: tokenizer, max_txt_len, qa_task.
    """

    def __init__(self, tokenizer, max_txt_len=20, qa_task="frameqa", n_options=N_OPTIONS):
        super().__init__(tokenizer, max_txt_len)
        self.qa_task, self.n_options = qa_task, n_options

    def collate_items(self, items, bad):
        exs = flat_list_of_lists([d["examples"] for d in items])
        if self.qa_task in MC_QA:
            texts = [e["q_str"] + " " + e["options_str_list"][i] for e in exs for i in range(self.n_options)]
            n_list = [d["n_examples"] * self.n_options for d in items]
        else:
            texts = [e["q_str"] for e in exs]
            n_list = [d["n_examples"] for d in items]
        ids, mask = tokenize(self.tokenizer, texts, self.max_txt_len)
        labels = (torch.tensor([int(e["label"]) for e in exs], dtype=torch.long)
                  if exs[0]["label"] is not None else None)
        return {"visual_inputs": stack_visual(items), "text_input_ids": ids, "text_input_mask": mask,
                "labels": labels, "question_ids": [e["question_id"] for e in exs],
                "answer_types": [e.get("answer_type") for e in exs], "n_examples_list": n_list,
                "vid_ids": [d["vid_id"] for d in items], "bad_videos": bad}
