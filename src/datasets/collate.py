"""Tokenisation, visual stacking and the bad-video prelude shared by the task collators."""
import torch


def tokenize(tokenizer, texts, max_txt_len):
    """[CLS] text [SEP] pad... -> (input_ids, attention_mask), both long (N, max_txt_len)."""
    enc = tokenizer(list(texts), padding="max_length", truncation=True, max_length=max_txt_len,
                    return_tensors="pt")
    return enc["input_ids"].long(), enc["attention_mask"].long()


def stack_visual(items):
    """(B, T, 3, S, S) float from the items' "vid" tensors (all the same shape)."""
    return torch.stack([d["vid"] for d in items])


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
