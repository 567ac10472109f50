"""Tokenisation, visual stacking and the bad-video prelude shared by the task collators."""
import math

import torch
from torch.utils.data import get_worker_info

from clipbert_legacy.datasets.image_ops import PaddedFrames


def tokenize(tokenizer, texts, max_txt_len):
    """[CLS] text [SEP] pad... -> (input_ids, attention_mask), both long (N, max_txt_len)."""
    enc = tokenizer(list(texts), padding="max_length", truncation=True, max_length=max_txt_len,
                    return_tensors="pt")
    return enc["input_ids"].long(), enc["attention_mask"].long()


def batch_buffer(shape, dtype):
    """An empty tensor for a batch: in shared memory when called in a DataLoader worker (as torch's
    default_collate does), so handing the batch to the main process copies nothing."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    proto = torch.empty(0, dtype=dtype)
    return proto.new(proto._typed_storage()._new_shared(math.prod(shape))).view(shape)


def stack_visual(items):
    """(B, T, 3, S, S) from the items' "vid": :class:`PaddedFrames` (the datasets') are resized and
    padded straight into one batch tensor (float32, or uint8 with img_resize "uint8"); tensors (all
    the same shape) are stacked."""
    vids = [d["vid"] for d in items]
    if not all(isinstance(v, PaddedFrames) for v in vids):
        return torch.stack([v.tensor() if isinstance(v, PaddedFrames) else v for v in vids])
    shapes, dtypes = {v.shape for v in vids}, {v.dtype for v in vids}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise ValueError(f"the videos of a batch differ in shape/dtype: {sorted(map(tuple, shapes))} "
                         f"{sorted(map(str, dtypes))}")
    out = batch_buffer((len(vids), *vids[0].shape), vids[0].dtype)
    for i, v in enumerate(vids):
        v.write_into(out[i])
    return out


def split_bad(batch):
    """Items with a loaded video, and all [(key, reason)] bad-video records of the batch."""
    bad = [tuple(b) for d in batch for b in d.get("bad_videos", [])]
    return [d for d in batch if d.get("vid") is not None], bad


def empty_batch(bad):
    """What a collator returns when every video of the batch failed (evaluation with skipping)."""
    return {"visual_inputs": None, "n_examples_list": [], "bad_videos": bad}


class CollatorBase:
    """A task collator: drops the items whose video failed, returns :func:`empty_batch` when none is
    left, else ``self.collate_items(items, bad)``. ``collate_batch`` is ClipBERT's method name.

    Args: tokenizer (BertTokenizerFast), max_txt_len (incl. [CLS]/[SEP]).
    """

    def __init__(self, tokenizer, max_txt_len=20):
        self.tokenizer, self.max_txt_len = tokenizer, int(max_txt_len)

    def __call__(self, batch):
        items, bad = split_bad(batch)
        if not items:
            return empty_batch(bad)
        return self.collate_items(items, bad)

    def collate_items(self, items, bad):
        """The batch dict of ``items`` (all with a loaded video); ``bad`` = [(key, reason)]."""
        raise NotImplementedError

    def collate_batch(self, batch):
        return self(batch)
