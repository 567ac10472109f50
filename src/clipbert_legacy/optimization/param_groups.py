"""Named parameter groups (transformer / CNN x lr-multiplier prefix x no-decay) and role-based LRs.

ClipBERT built exactly 8 groups and set LRs by index (``assert len(param_groups) == 8``). Here every
group carries its ``name``, ``role`` (``transformer`` or ``cnn``) and ``lr_mul``; empty groups are
dropped and :func:`set_lr` sets ``lr = base_lr[role] * lr_mul`` for any number of groups.

Membership follows ClipBERT's rules, applied to parameter names:

* part: names whose first component contains ``cnn`` (``cnn.*``; ClipBERT tested the whole name) are
  CNN; all other trainable parameters are transformer parameters (ClipBERT silently left them out of
  the optimizer).
* multiplier: the name contains ``{transformer,cnn}_lr_mul_prefix`` (empty prefix: every name, the
  multiplier then applies to the whole part, as in ClipBERT).
* no weight decay: biases and LayerNorm weights, i.e. a name containing ``bias`` or
  ``LayerNorm.weight`` (ClipBERT), or any parameter of a LayerNorm-type module (nn.LayerNorm,
  FusedLayerNorm, or a module class named ``*LayerNorm``) whatever its attribute name. BatchNorm
  weights are decayed, as in ClipBERT.
"""
import logging

from torch import nn

logger = logging.getLogger(__name__)

ROLES = ("transformer", "cnn")


def _layer_norm_param_names(model):
    names = set()
    for mname, mod in model.named_modules():
        if isinstance(mod, nn.LayerNorm) or type(mod).__name__.endswith("LayerNorm"):
            for pname, _ in mod.named_parameters(recurse=False):
                names.add(f"{mname}.{pname}" if mname else pname)
    return names


def is_no_decay(name, layer_norm_names=()):
    return "bias" in name or "LayerNorm.weight" in name or name in layer_norm_names


def part_of(name):
    return "cnn" if name.startswith("cnn.") or "cnn" in name.split(".")[0] else "transformer"


def build_param_groups(model, cfg):
    """Optimizer param-group dicts for ``model`` with ClipBERT's LR/decay rules (see module doc).

    ``cfg`` needs learning_rate, weight_decay, transformer_lr_mul, transformer_lr_mul_prefix,
    cnn_learning_rate, cnn_weight_decay, cnn_lr_mul, cnn_lr_mul_prefix.
    """
    ln_names = _layer_norm_param_names(model)
    settings = {
        "transformer": (cfg.learning_rate, cfg.weight_decay, cfg.transformer_lr_mul,
                        cfg.transformer_lr_mul_prefix),
        "cnn": (cfg.cnn_learning_rate, cfg.cnn_weight_decay, cfg.cnn_lr_mul, cfg.cnn_lr_mul_prefix),
    }
    buckets = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        role = part_of(name)
        lr, wd, mul, prefix = settings[role]
        in_prefix = prefix in name
        nd = is_no_decay(name, ln_names)
        key = (role, in_prefix, nd)
        if key not in buckets:
            buckets[key] = {
                "params": [], "param_names": [], "role": role, "lr_mul": mul if in_prefix else 1.0,
                "weight_decay": 0.0 if nd else wd, "lr": lr * (mul if in_prefix else 1.0),
                "name": f"{role}{'_mul' if in_prefix else ''}{'_no_decay' if nd else ''}",
            }
        buckets[key]["params"].append(p)
        buckets[key]["param_names"].append(name)
    order = [(r, pre, nd) for r in ROLES for pre in (True, False) for nd in (False, True)]
    groups = [buckets[k] for k in order if k in buckets]
    for g in groups:
        logger.info("param group %-28s %4d tensors %10d params lr_mul %g wd %g", g["name"],
                    len(g["params"]), sum(p.numel() for p in g["params"]), g["lr_mul"],
                    g["weight_decay"])
    return groups


def set_lr(optimizer, lr_by_role):
    """Set each group's LR from its role: ``lr = lr_by_role[group['role']] * group['lr_mul']``."""
    for g in optimizer.param_groups:
        g["lr"] = lr_by_role[g["role"]] * g["lr_mul"]


def build_optimizer(model, cfg):
    """The optimizer ``cfg.optim`` (adamw: ours, ClipBERT's; adam/adamax: torch) over named groups."""
    import torch

    from clipbert_legacy.optimization.adamw import AdamW
    groups = build_param_groups(model, cfg)
    if not groups:
        raise ValueError("the model has no trainable parameters (all requires_grad=False)")
    betas = tuple(cfg.betas)
    if cfg.optim == "adamw":
        return AdamW(groups, lr=cfg.learning_rate, betas=betas)
    if cfg.optim == "adam":
        return torch.optim.Adam(groups, lr=cfg.learning_rate, betas=betas)
    if cfg.optim == "adamax":
        return torch.optim.Adamax(groups, lr=cfg.learning_rate, betas=betas)
    raise ValueError(f"optim={cfg.optim!r} is invalid: expected adamw|adam|adamax")


def embedding_tables(model, min_rows=1024):
    """The trainable weights of ``nn.Embedding`` tables with at least ``min_rows`` rows (BERT's
    word embeddings; not the position or token-type tables): their gradients are row-sparse, so the
    engine has them averaged over the touched rows only (``row_sparse_allreduce``)."""
    seen, out = set(), []
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if (isinstance(mod, nn.Embedding) and w is not None and w.requires_grad
                and w.shape[0] >= min_rows and id(w) not in seen):
            seen.add(id(w))
            out.append(w)
    return out
