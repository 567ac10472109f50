"""Text-to-video retrieval: training (ITM with sampled negatives) and evaluation datasets."""
import logging
import random
from collections import OrderedDict

import torch

from clipbert_legacy.datasets.collate import CollatorBase, stack_visual, tokenize
from clipbert_legacy.datasets.data_utils import flat_list_of_lists
from clipbert_legacy.datasets.dataset_base import VideoDatasetBase

logger = logging.getLogger(__name__)


def mk_retrieval_examples(raw_rows):
    """jsonl rows {caption, clip_name} -> [{id, txt, vid_id}], id = row index (ClipBERT)."""
    return [{"id": i, "txt": r["caption"], "vid_id": r["clip_name"]} for i, r in enumerate(raw_rows)]


class VideoRetrievalDataset(VideoDatasetBase):
    """Training: one item = one video group of texts, each text with `itm_neg_size` negatives.

    Args:
        datalist: [(vid_id, [{id, txt, vid_id}, ...])] from `mk_input_group` (group size
            `max_n_example_per_group`).
        itm_neg_size: negative captions per positive, taken from random groups of other videos.
        Other args: see VideoDatasetBase (img_lmdb_dir, fps, num_frm, frm_sampling_strategy,
            max_img_size, n_clips, clip_mode, is_train=True, min_video_frames, max_retries, name).
    Item: {vid (T, 3, S, S) float, examples [{text_str, itm_label}], n_examples, vid_id, bad_videos}.
    """

    def __init__(self, datalist, img_lmdb_dir, itm_neg_size=1, **kw):
        kw.setdefault("is_train", True)
        kw.setdefault("name", "retrieval_train")
        super().__init__(datalist, img_lmdb_dir, **kw)
        self.itm_neg_size = int(itm_neg_size)
        if self.itm_neg_size > 0 and len({v for v, _ in datalist}) < 2:
            raise ValueError(f"{self.name}: itm_neg_size={itm_neg_size} needs captions of at least 2 videos")

    def __len__(self):
        return len(self.datalist)

    def _negative_caption(self, gt_vid_id):
        while True:  # ClipBERT: a random group whose video differs
            neg_vid, neg_examples = self.datalist[int(random.random() * len(self))]
            if neg_vid != gt_vid_id:
                return neg_examples[int(random.random() * len(neg_examples))]["txt"]

    def _build(self, index):
        vid_id, examples = self.datalist[index]
        frames, reason = self.try_load_video(vid_id)
        if frames is None:
            return None, (vid_id, reason)
        texts = []
        for e in examples:
            texts.append({"text_str": e["txt"], "itm_label": 1})
            texts.extend({"text_str": self._negative_caption(vid_id), "itm_label": 0}
                         for _ in range(self.itm_neg_size))
        return {"vid": frames, "examples": texts, "n_examples": len(texts), "vid_id": vid_id}, None

    def __getitem__(self, index):
        return self.get_with_replacement(index, self._build)


class VideoRetrievalEvalDataset(VideoDatasetBase):
    """Evaluation: one item = one video x a chunk of all captions (load with batch_size 1).

    Unlike ClipBERT (one item per caption row, so a video with k captions was scored k times),
    each distinct video appears once per caption chunk, in order of first appearance.

    Args:
        datalist: [{id, txt, vid_id}] with id == row index (see mk_retrieval_examples).
        caption_batch_size: captions per item (ClipBERT eval_retrieval_batch_size /
            inference_batch_size); None = all captions in one item.
        vid_ids: the videos to score every caption against (default: the captions' ground-truth
            videos); more videos are distractors, as when scoring a folder of one's own videos.
        Other args: see VideoDatasetBase (is_train=False; skip_bad_videos decides failure).
    Attributes for the evaluator: gt_cap_id2vid_id {caption id: vid_id}, id2data {id: row},
        vid_ids (distinct, ordered).
    Item: {vid, examples [{text_str, id}], n_examples, vid_id, bad_videos}.
    """

    def __init__(self, datalist, img_lmdb_dir, caption_batch_size=None, vid_ids=None, **kw):
        kw.setdefault("is_train", False)
        kw.setdefault("name", "retrieval_eval")
        super().__init__(datalist, img_lmdb_dir, **kw)
        for i, d in enumerate(datalist):
            if d["id"] != i:
                raise ValueError(f"{self.name}: caption ids must equal row indices; row {i} has id {d['id']}")
        self.gt_cap_id2vid_id = {d["id"]: d["vid_id"] for d in datalist}
        self.id2data = {d["id"]: d for d in datalist}
        self.vid_ids = list(OrderedDict.fromkeys([d["vid_id"] for d in datalist] + list(vid_ids or [])))
        texts = [{"text_str": d["txt"], "id": d["id"]} for d in datalist]
        bs = caption_batch_size or len(texts)
        self.caption_chunks = [texts[i:i + bs] for i in range(0, len(texts), bs)]
        self.items = [(v, c) for v in self.vid_ids for c in range(len(self.caption_chunks))]
        self._cache = (None, None)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        vid_id, chunk_idx = self.items[index]
        if self._cache[0] == vid_id:  # chunks of one video come in a row: decode once
            frames, reason = self._cache[1]
        else:
            frames, reason = self.try_load_video(vid_id)
            self._cache = (vid_id, (frames, reason))
        examples = self.caption_chunks[chunk_idx]
        bad = [(vid_id, reason)] if frames is None else []
        return {"vid": frames, "examples": examples, "n_examples": len(examples), "vid_id": vid_id,
                "bad_videos": bad}


class VideoRetrievalCollator(CollatorBase):
    """Batch for retrieval: visual_inputs (B, T, 3, S, S) float, text_input_ids/mask (ΣN, L) long,
    labels (ΣN,) long or None, caption_ids list or None, n_examples_list [N_i], vid_id (B == 1),
    bad_videos [(key, reason)].

    Args: tokenizer (BertTokenizerFast), max_txt_len (incl. [CLS]/[SEP]).
    """

    def collate_items(self, items, bad):
        texts = flat_list_of_lists([d["examples"] for d in items])
        ids, mask = tokenize(self.tokenizer, [t["text_str"] for t in texts], self.max_txt_len)
        labels = (torch.tensor([t["itm_label"] for t in texts], dtype=torch.long)
                  if "itm_label" in texts[0] else None)
        out = {"visual_inputs": stack_visual(items), "text_input_ids": ids, "text_input_mask": mask,
               "labels": labels, "caption_ids": [t["id"] for t in texts] if "id" in texts[0] else None,
               "n_examples_list": [d["n_examples"] for d in items], "bad_videos": bad}
        if len(items) == 1:
            out["vid_id"] = items[0]["vid_id"]
        out["vid_ids"] = [d["vid_id"] for d in items]
        return out
