"""MSRVTT-MC style multiple choice: one video, 5 candidate captions, pick the matching one."""
import logging

import torch

from clipbert_legacy.datasets.collate import CollatorBase, stack_visual, tokenize
from clipbert_legacy.datasets.dataset_base import VideoDatasetBase

logger = logging.getLogger(__name__)
N_OPTIONS = 5


def mk_mc_examples(raw_rows, path="<jsonl>"):
    """jsonl rows {qid, clip_name, options[5], answer?} -> [{qid, vid_id, options, answer}]."""
    out = []
    for i, r in enumerate(raw_rows):
        if not isinstance(r["options"], list) or len(r["options"]) != N_OPTIONS:
            raise ValueError(f"{path}: row {i + 1}: 'options' must hold {N_OPTIONS} captions, "
                             f"got {r['options']!r}")
        out.append({"qid": r["qid"], "vid_id": r["clip_name"], "options": r["options"],
                    "answer": r.get("answer")})
    return out


class VideoMCDataset(VideoDatasetBase):
    """Evaluation only: one item = one video with its 5 options (ClipBERT's MC eval dataset,
    without mutating the stored examples).

    Args:
        datalist: [{qid, vid_id, options, answer}] (mk_mc_examples).
        Other args: see VideoDatasetBase (is_train=False; skip_bad_videos decides failure).
    Item: {vid, examples [{options_str_list, qid, label}], n_examples=1, vid_id, bad_videos}.
    """

    def __init__(self, datalist, img_lmdb_dir, **kw):
        kw.setdefault("is_train", False)
        kw.setdefault("name", "msrvtt_mc")
        super().__init__(datalist, img_lmdb_dir, **kw)
        self.qid2data = {d["qid"]: d for d in datalist}

    def __len__(self):
        return len(self.datalist)

    def __getitem__(self, index):
        d = self.datalist[index]
        frames, reason = self.try_load_video(d["vid_id"])
        ex = {"options_str_list": list(d["options"]), "qid": d["qid"], "label": d["answer"]}
        return {"vid": frames, "examples": [ex], "n_examples": 1, "vid_id": d["vid_id"],
                "bad_videos": [] if frames is not None else [(d["vid_id"], reason)]}


class VideoMCCollator(CollatorBase):
    """Batch: visual_inputs (B, T, 3, S, S), text_input_ids/mask (B*5, L) (the options),
    labels (B,) long (correct option) or None, question_ids [qid], n_examples_list [5]*B, bad_videos.

    Args: tokenizer, max_txt_len.
    """

    def collate_items(self, items, bad):
        exs = [d["examples"][0] for d in items]
        options = [o for e in exs for o in e["options_str_list"]]
        ids, mask = tokenize(self.tokenizer, options, self.max_txt_len)
        labels = (torch.tensor([int(e["label"]) for e in exs], dtype=torch.long)
                  if all(e["label"] is not None for e in exs) else None)
        return {"visual_inputs": stack_visual(items), "text_input_ids": ids, "text_input_mask": mask,
                "labels": labels, "question_ids": [e["qid"] for e in exs],
                "n_examples_list": [N_OPTIONS] * len(exs), "vid_ids": [d["vid_id"] for d in items],
                "bad_videos": bad}
