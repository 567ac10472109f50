"""Image-text pretraining data (ClipBERT's COCO + Visual Genome captions): MLM masking, ITM negatives.

Annotation rows are ``{caption, <key>}`` with the image (or video) key in ``image_id``, ``coco_id``,
``vg_id`` or ``clip_name``; the store holds the bytes under ``str(key)``. ``vis_format`` "image"
decodes with PIL into a 1-frame clip, "video" samples frames as the video tasks do.

* **ITM**: each caption is replaced, with probability ``itm_neg_prob``, by a caption of another image
  (label 0; else 1). Evaluation draws its negatives from a generator seeded by the item index, so
  validation ITM accuracy is the same every time (ClipBERT's random negatives made it vary).
* **MLM** (BERT's rule, as ClipBERT): 15% of the real tokens ([CLS]/[SEP]/padding never) are chosen;
  of those 80% become [MASK], 10% a random token, 10% stay; labels are the original ids there and
  -100 elsewhere, and -100 on mismatched pairs. The collator's generator is seeded from the items'
  per-sample seeds, so masks do not depend on DataLoader workers and a resumed run masks alike.
* ``split_objectives`` (option ``split_mlm_itm``): each caption serves one objective, drawn with
  probability 0.5: MLM (masked, its own image; ITM label -100) or ITM (unmasked, negative with
  ``itm_neg_prob``; MLM labels -100). ClipBERT's joint mode asks ITM to judge masked captions, and in
  short captions the masked word is often the one that decides the match.
"""
import random

import torch

from clipbert_legacy.datasets.collate import CollatorBase, stack_visual, tokenize
from clipbert_legacy.datasets.data_utils import flat_list_of_lists
from clipbert_legacy.datasets.dataset_base import VideoDatasetBase
from clipbert_legacy.datasets.dataset_vqa import decode_image
from clipbert_legacy.datasets.decoder import VideoDecodeError

KEY_FIELDS = ("image_id", "coco_id", "vg_id", "clip_name")
MLM_PROB = 0.15


def mk_pretrain_examples(rows, path="<jsonl>"):
    """jsonl rows -> [{txt, img_id}]; the key field is the first of KEY_FIELDS a row has."""
    out = []
    for i, r in enumerate(rows):
        key = next((r[k] for k in KEY_FIELDS if r.get(k) is not None), None)
        if key is None:
            raise ValueError(f"{path}:{i + 1}: no image key; give one of {list(KEY_FIELDS)}")
        out.append({"txt": r["caption"], "img_id": str(key)})
    return out


def mask_tokens(input_ids, attention_mask, tokenizer, generator, prob=MLM_PROB):
    """(masked ids, labels) by BERT's 80/10/10 rule over the real, non-special tokens."""
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for tid in (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id):
        special |= input_ids == tid
    candidates = attention_mask.bool() & ~special
    chosen = candidates & (torch.rand(input_ids.shape, generator=generator) < prob)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    masked = input_ids.clone()
    to_mask = chosen & (torch.rand(input_ids.shape, generator=generator) < 0.8)
    masked[to_mask] = tokenizer.mask_token_id
    to_random = chosen & ~to_mask & (torch.rand(input_ids.shape, generator=generator) < 0.5)
    masked[to_random] = torch.randint(len(tokenizer), input_ids.shape, generator=generator)[to_random]
    return masked, labels


class PretrainDataset(VideoDatasetBase):
    """One item = one image (or video) with its caption group; see the module docstring.

    Args: datalist [(img_id, [{txt, img_id}])] (mk_input_group), img_lmdb_dir, vis_format
    image|video, itm_neg_prob; others see VideoDatasetBase.
    Item: {vid (T, 3, S, S), examples [{text_str, itm_label}], n_examples, vid_id, mlm_seed}.
    """

    def __init__(self, datalist, img_lmdb_dir, vis_format="image", itm_neg_prob=0.5, split_objectives=False,
                 **kw):
        kw.setdefault("name", "pretrain")
        super().__init__(datalist, img_lmdb_dir, **kw)
        if vis_format not in ("image", "video"):
            raise ValueError(f"{self.name}: vis_format={vis_format!r} must be 'image' or 'video'")
        if not 0 <= itm_neg_prob <= 1:
            raise ValueError(f"itm_neg_prob={itm_neg_prob} must be in [0, 1]")
        if itm_neg_prob > 0 and len({k for k, _ in datalist}) < 2:
            raise ValueError(f"{self.name}: ITM negatives need captions of at least 2 images")
        self.vis_format, self.itm_neg_prob = vis_format, float(itm_neg_prob)
        self.split_objectives = bool(split_objectives)

    def __len__(self):
        return len(self.datalist)

    def load_video(self, vid_id):
        if self.vis_format == "video":
            return super().load_video(vid_id)
        try:
            data = self.store.get(vid_id)
        except KeyError as e:
            raise VideoDecodeError("missing_key", e.args[0]) from None
        return self.padded(decode_image(data, self.max_frame_pixels))

    def _negative(self, img_id, rng):
        for _ in range(5):  # ClipBERT: 5 tries for a caption of another image
            other, exs = self.datalist[rng.randrange(len(self.datalist))]
            if other != img_id:
                return exs[rng.randrange(len(exs))]["txt"]
        return next(e["txt"] for k, g in self.datalist if k != img_id for e in g)

    def _build(self, index):
        img_id, examples = self.datalist[index]
        frames, reason = self.try_load_video(img_id)
        if frames is None:
            return None, (img_id, reason)
        rng = random.Random(index) if not self.is_train else random
        texts = []
        for e in examples:
            mlm_only = self.split_objectives and rng.random() < 0.5
            neg = not mlm_only and rng.random() < self.itm_neg_prob
            text = self._negative(img_id, rng) if neg else e["txt"]
            texts.append({"text_str": text, "itm_label": -100 if mlm_only else int(not neg),
                          "mlm": mlm_only or not self.split_objectives})
        seed = rng.getrandbits(31)
        return {"vid": frames, "examples": texts, "n_examples": len(texts), "vid_id": img_id,
                "mlm_seed": seed}, None

    def __getitem__(self, index):
        return self.load_item(index, self._build)


class PretrainCollator(CollatorBase):
    """visual_inputs (B, T, 3, S, S), text_input_ids (N, L) masked, text_input_mask, mlm_labels (N, L),
    itm_labels (N,), n_examples_list, bad_videos."""

    def collate_items(self, items, bad):
        texts = flat_list_of_lists([d["examples"] for d in items])
        ids, mask = tokenize(self.tokenizer, [t["text_str"] for t in texts], self.max_txt_len)
        g = torch.Generator()
        g.manual_seed(sum(d["mlm_seed"] for d in items) % (2 ** 31))
        masked, mlm_labels = mask_tokens(ids, mask, self.tokenizer, g)
        itm = torch.tensor([t["itm_label"] for t in texts], dtype=torch.long)
        mlm_labels[itm == 0] = -100  # no MLM on a caption of another image
        itm_only = torch.tensor([not t.get("mlm", True) for t in texts])
        masked[itm_only], mlm_labels[itm_only] = ids[itm_only], -100  # split_objectives: ITM sees it whole
        return {"visual_inputs": stack_visual(items), "text_input_ids": masked, "text_input_mask": mask,
                "mlm_labels": mlm_labels, "itm_labels": itm,
                "n_examples_list": [d["n_examples"] for d in items], "vid_ids": [d["vid_id"] for d in items],
                "bad_videos": bad}
