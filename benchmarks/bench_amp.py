"""Overhead of clipbert_legacy.compat.amp on a small transformer (CPU), and O2 vs O0 model+optimizer memory.

Step time: a plain torch loop (forward, backward, AdamW step, zero_grad) against the same loop
through ``amp.initialize(opt_level="O0")`` + ``amp.scale_loss`` (what ClipBERT runs with fp16 off).
Single steps of both are interleaved (alternating which goes first) and the median step time of
each is compared, so load from other processes on the machine hits both alike. Target: ratio <= 1.03.

Memory: bytes held by model parameters, fp32 master weights and optimizer state after one step,
for O0 (fp32 everything) and O2 (fp16 model with fp32 BatchNorm, fp32 masters owned by the optimizer).

    python benchmarks/bench_amp.py [--steps 20 --rounds 7 --threads 1]
"""
import argparse
import statistics
import time
import warnings

import torch
from torch import nn

from clipbert_legacy.compat import amp


class TinyTransformer(nn.Module):
    def __init__(self, vocab=1000, d=128, layers=2, heads=4, classes=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.bn = nn.BatchNorm1d(d)  # kept fp32 under O2
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        h = self.enc(self.emb(ids)).mean(1)
        return self.head(self.bn(h))


def make(seed=0):
    torch.manual_seed(seed)
    model = TinyTransformer()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def batch(seed, b=16, L=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1000, (b, L), generator=g), torch.randint(0, 10, (b,), generator=g)


def plain_step(model, opt, ids, y):
    loss = nn.functional.cross_entropy(model(ids), y)
    loss.backward()
    opt.step()
    opt.zero_grad()


def amp_step(model, opt, ids, y):
    loss = nn.functional.cross_entropy(model(ids), y)
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    opt.step()
    opt.zero_grad()


def timed(step, model, opt, steps, seed):
    t0 = time.perf_counter()
    for i in range(steps):
        step(model, opt, *batch(seed + i))
    return (time.perf_counter() - t0) / steps


def nbytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def memory(model, opt):
    params = list(model.parameters()) + list(model.buffers())
    masters = [p for p in amp.master_params(opt) if all(p is not q for q in model.parameters())]
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"model": nbytes(params), "masters": nbytes(masters), "optimizer_state": nbytes(state)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore", message="amp: fp16 on CPU")

    base_model, base_opt = make()
    ours_model, ours_opt = make()
    ours_model, ours_opt = amp.initialize(ours_model, ours_opt, opt_level="O0", verbosity=0)
    for m, o, s in ((base_model, base_opt, plain_step), (ours_model, ours_opt, amp_step)):
        timed(s, m, o, 3, seed=0)  # warm-up
    base, ours = [], []
    runs = {"base": (plain_step, base_model, base_opt, base), "ours": (amp_step, ours_model, ours_opt, ours)}
    for i in range(a.rounds * a.steps):  # single steps, interleaved, alternating order
        for name in (("base", "ours") if i % 2 == 0 else ("ours", "base")):
            step, m, o, times = runs[name]
            times.append(timed(step, m, o, 1, seed=1000 + i))
    tb, to = statistics.median(base), statistics.median(ours)
    n_params = sum(p.numel() for p in base_model.parameters())
    print(f"model: TinyTransformer ({n_params} params), batch 16x32 tokens, AdamW, "
          f"{torch.get_num_threads()} thread(s), {a.rounds * a.steps} interleaved steps each, median")
    print(f"plain torch loop   : {tb * 1e3:8.2f} ms/step")
    print(f"amp O0 (ours)      : {to * 1e3:8.2f} ms/step")
    print(f"overhead ratio     : {to / tb:8.3f}  (target <= 1.03)")

    mem = {}
    for level in ("O0", "O2"):
        m, o = make()
        m, o = amp.initialize(m, o, opt_level=level, verbosity=0)
        t = time.perf_counter()
        amp_step(m, o, *batch(1))
        dt = time.perf_counter() - t
        mem[level] = memory(m, o)
        total = sum(mem[level].values())
        print(f"{level} memory        : model {mem[level]['model']:>9d} B + masters "
              f"{mem[level]['masters']:>9d} B + optimizer state {mem[level]['optimizer_state']:>9d} B "
              f"= {total:>9d} B   (first step {dt * 1e3:.0f} ms)")
    t0, t2 = sum(mem["O0"].values()), sum(mem["O2"].values())
    model_ratio = mem["O2"]["model"] / mem["O0"]["model"]
    print(f"O2 / O0 memory     : {t2 / t0:8.3f}  (model alone: {model_ratio:.3f})")


if __name__ == "__main__":
    main()
