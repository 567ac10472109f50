"""detectron2's ``seed_all_rng``: seeds python, numpy and torch from one number (a fresh one when None)."""
import logging
import os
import random
from datetime import datetime

import numpy as np
import torch

__all__ = ["seed_all_rng"]


def seed_all_rng(seed=None):
    """Seed ``random``, ``numpy`` and ``torch``; a seed from pid, time and urandom when ``seed`` is None."""
    if seed is None:
        seed = (os.getpid() + int(datetime.now().strftime("%S%f")) + int.from_bytes(os.urandom(2), "big"))
        logging.getLogger(__name__).info("Using a generated random seed %d", seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)
    random.seed(seed)
