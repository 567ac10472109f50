"""ClipBERT's image-text pretraining options (``get_pretraining_args``); declared as the task spec
``PRETRAIN`` (its task class carries it). The shared schema accepts the same keys as no-ops for
configs that carry them; here they act. ``pixel_random_sampling_size`` is a shared option: every task's
training applies it."""
from clipbert_legacy.config.schema import Config, ConfigError
from clipbert_legacy.config.schema import Option as O
from clipbert_legacy.config.task_spec import TaskSpec

PRETRAIN_OPTIONS = [
    O("use_mlm", bool, False, "masked language modelling loss (15% of the caption tokens)", group="pretrain"),
    O("use_itm", bool, False, "image-text matching loss (a caption of another image as negative)",
      group="pretrain"),
    O("itm_neg_prob", float, 0.5, "probability that a caption is replaced by one of another image (ITM)",
      min=0, max=1, group="pretrain"),
    O("split_mlm_itm", bool, False, "each caption serves one objective: with probability 0.5 MLM (masked, "
      "its own image), else ITM on the unmasked caption (a negative with itm_neg_prob); ClipBERT (0) "
      "computes both on one masked caption, so ITM often cannot see the masked words that decide it",
      group="pretrain"),
    O("mlm_loss_average", str, "masked", "MLM loss: mean over the masked tokens (masked), or ClipBERT's "
      "scale (all_positions: their summed loss over every text position of the batch, so about the masking "
      "rate times smaller next to ITM)", choices=("masked", "all_positions"), group="pretrain"),
]


def _pretrain_post(cfg: Config, notices: list) -> None:
    if not (cfg.use_mlm or cfg.use_itm):
        raise ConfigError("pretraining needs use_mlm=1 and/or use_itm=1")
    if cfg.use_itm and cfg.itm_neg_prob == 0:
        notices.append("use_itm with itm_neg_prob 0: every pair matches, ITM learns nothing")
    cfg.task_type = "pretrain"


PRETRAIN = TaskSpec("pretrain", PRETRAIN_OPTIONS, _pretrain_post)
