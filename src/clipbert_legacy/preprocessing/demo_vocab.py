"""The demo dataset's vocabulary: colours, shapes, motions and the caption/answer phrases built from
them. Shared by :mod:`clipbert_legacy.preprocessing.make_demo_data` (which renders and annotates the videos)
and :mod:`clipbert_legacy.preprocessing.pretrain_demo_cnn` (whose attribute heads predict the same values).

Changing anything here changes the demo data (it is built byte-identically from these tables).
"""
COLORS = {"red": (225, 30, 30), "green": (30, 190, 40), "blue": (40, 70, 235),
          "yellow": (235, 220, 40), "purple": (150, 40, 200), "cyan": (40, 215, 215)}
SHAPES = ("square", "circle", "triangle")
MOTIONS = ("left", "right", "up", "down", "still")
MOTION_OPTIONS = {"left": "it moves to the left", "right": "it moves to the right", "up": "it moves up",
                  "down": "it moves down", "still": "it stays still"}
_DIR_PHRASE = {"left": "to the left", "right": "to the right", "up": "up", "down": "down"}
_MOVE_TEMPLATES = ("a {c} {s} moves {d}", "the {c} {s} is moving {d}", "a {c} {s} slides {d}")
_STILL_TEMPLATES = ("a {c} {s} stays still", "the {c} {s} does not move", "a {c} {s} stands still")
COMBOS = [(c, s, m) for c in COLORS for s in SHAPES for m in MOTIONS]


def caption_for(color: str, shape: str, motion: str, template_idx: int) -> str:
    """One of three caption phrasings (``template_idx % 3``) of a colour/shape/motion combination."""
    if motion == "still":
        return _STILL_TEMPLATES[template_idx % 3].format(c=color, s=shape)
    return _MOVE_TEMPLATES[template_idx % 3].format(c=color, s=shape, d=_DIR_PHRASE[motion])
