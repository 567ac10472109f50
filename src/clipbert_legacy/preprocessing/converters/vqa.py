"""VQA 2.0 converter: visualqa.org's question + annotation files -> the files ClipBERT's VQA config reads,
``vqa_k_trainval.jsonl``, ``vqa_k_test.jsonl`` and ``trainval_ans2label.json`` (+ ``vqa_test.jsonl``,
``vqa_test_dev.jsonl`` for the evaluation server when those question files are present).

Raw files (in ``--raw_dir``, their download names):

* questions ``v2_OpenEnded_mscoco_{train2014,val2014,test2015,test-dev2015}_questions.json``:
  ``{"data_subtype", "questions": [{image_id, question, question_id}]}``
* annotations ``v2_mscoco_{train2014,val2014}_annotations.json``: ``{"annotations": [{question_id,
  image_id, answers: [{answer, ...}] x 10, multiple_choice_answer, answer_type, question_type}]}``

Output rows are what ``clipbert_legacy.datasets.dataset_vqa`` reads: ``{question, image_id, question_id,
answers, answer_type, question_type}``, ``answers`` the 10 human answers normalised as the official VQA
evaluation normalises them (so the dataset's soft scores ``min(#humans / 3, 1)`` count equal answers
together); test splits have no answers. ``image_id`` is the image's LMDB key: by default COCO's file
stem ``COCO_{train2014|val2014|test2015}_{id:012d}`` (``file2lmdb`` keys images by file stem; test-dev
questions use test2015 images), or ``str(id)`` with ``--image_key id``.

Splits ("k" for Karpathy): ``vqa_k_test`` holds the val2014 questions on the 5,000 Karpathy-test
images (``--karpathy_split dataset_coco.json``; without it all val2014 questions), ``vqa_k_trainval``
every other train2014 + val2014 question. The answer vocabulary is the usual VQA 2.0 one: the
normalised ``multiple_choice_answer`` (the most common human answer) of the ``vqa_k_trainval``
questions, answers seen at least ``--min_count`` (9) times, most frequent first (train + val with 9
gives ClipBERT's 3,129 answers; holding the Karpathy test out may change that count).
"""
import os
import re
from collections import Counter

from clipbert_legacy.preprocessing.converters.common import check_unique, need, read_json_items, text_of

SPLITS = {"train": "train2014", "val": "val2014", "test": "test2015", "test_dev": "test-dev2015"}
QUESTIONS = "v2_OpenEnded_mscoco_{}_questions.json"
ANNOTATIONS = "v2_mscoco_{}_annotations.json"
DEFAULT_MIN_COUNT = 9

# --- answer normalisation: the official evaluation's rules, written from its description -----------
PUNCT = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`",
         ",", "?", "!")
_DIGIT_COMMA = re.compile(r"\d,\d")
_PERIOD_NOT_BEFORE_DIGIT = re.compile(r"\.(?!\d)")
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = ("a", "an", "the")
# Contractions annotators typed without their apostrophe(s) get them back. Words that are English
# without one (its, well, were, shed, hell, ill, wed, id) are not in the list; the evaluation leaves them.
_CONTRACTIONS = (
    "ain't aren't can't could've couldn't couldn't've didn't doesn't don't hadn't hadn't've hasn't "
    "haven't he'd he'd've he's how'd how'll how's isn't it'd it'd've it'll let's ma'am mightn't "
    "mightn't've might've mustn't must've needn't not've o'clock oughtn't shan't she'd've should've "
    "shouldn't shouldn't've somebody'd've somebody'll somebody's someone'd someone'd've someone'll "
    "someone's something'd something'd've something'll something's that's there'd there'd've there're "
    "there's they'd they'd've they'll they're they've 'twas wasn't we'd've we've weren't what'll what're "
    "what's what've when's where'd where's where've who'd who'd've who'll who's who've why'll why're "
    "why's won't would've wouldn't wouldn't've y'all y'all'll you'd you'd've you'll you're you've").split()


def _apostrophe_variants(word):
    """'couldn't've' -> couldntve, couldn'tve, couldnt've: every way of dropping apostrophes."""
    parts = word.split("'")
    out = {""}
    for i, part in enumerate(parts):
        out = {o + part for o in out} if i == 0 else {o + sep + part for o in out for sep in ("", "'")}
    return out - {word}


CONTRACTIONS = {v: w for w in _CONTRACTIONS for v in _apostrophe_variants(w)}


def normalize_answer(answer):
    """An answer as the VQA evaluation compares it: punctuation, then number words, articles and
    contractions (``"Two dogs."`` -> ``"2 dogs"``, ``"1,000"`` -> ``"1000"``, ``"dont"`` -> ``"don't"``)."""
    text = answer.replace("\n", " ").replace("\t", " ").strip()
    out = text
    for p in PUNCT:  # next to a space (or a digit comma anywhere): dropped; inside a word: a space
        if p + " " in text or " " + p in text or _DIGIT_COMMA.search(text):
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    out = _PERIOD_NOT_BEFORE_DIGIT.sub("", out)
    words = [NUMBER_WORDS.get(w, w) for w in out.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


# --- files -------------------------------------------------------------------------------------------
def image_key(image_id, subtype, style, where):
    if isinstance(image_id, bool) or not isinstance(image_id, int) or image_id < 0:
        raise ValueError(f"{where}: image_id must be a non-negative integer, got {image_id!r}")
    if style == "id":
        return str(image_id)
    folder = "test2015" if subtype.startswith("test") else subtype  # test-dev images are test2015's
    return f"COCO_{folder}_{image_id:012d}"


def read_questions(path, subtype, style):
    """(rows, their integer COCO image ids)."""
    rows, ids, image_ids = [], [], []
    for where, q in read_json_items(path, "questions", ("question_id",)):
        need(q, where, ("image_id", "question", "question_id"))
        rows.append({"question": text_of(q, "question", where), "question_id": q["question_id"],
                     "image_id": image_key(q["image_id"], subtype, style, where)})
        ids.append((where, q["question_id"]))
        image_ids.append(q["image_id"])
    check_unique(ids, "question_id")
    if not rows:
        raise ValueError(f"{path}: no questions")
    return rows, image_ids


def read_annotations(path):
    """{question_id: (where, annotation)} with the answers normalised."""
    out, ids = {}, []
    for where, a in read_json_items(path, "annotations", ("question_id",)):
        need(a, where, ("question_id", "answers", "multiple_choice_answer", "answer_type"))
        if not isinstance(a["answers"], list) or not a["answers"]:
            raise ValueError(f"{where}: 'answers' must be a non-empty list of {{answer: ...}} objects")
        answers = []
        for h in a["answers"]:
            if not isinstance(h, dict) or not isinstance(h.get("answer"), str):
                raise ValueError(f"{where}: each of 'answers' must be an object with a string 'answer', "
                                 f"got {h!r}")
            answers.append(normalize_answer(h["answer"]))
        ids.append((where, a["question_id"]))
        out[a["question_id"]] = (where, {"answers": answers, "answer_type": a["answer_type"],
                                         "question_type": a.get("question_type"),
                                         "mc": normalize_answer(str(a["multiple_choice_answer"]))})
    check_unique(ids, "question_id")
    return out


def convert_split(raw_dir, subtype, style):
    """(rows, normalised most common answers, integer image ids) of one split; annotated splits must
    annotate exactly their questions."""
    q_path = os.path.join(raw_dir, QUESTIONS.format(subtype))
    rows, image_ids = read_questions(q_path, subtype, style)
    a_path = os.path.join(raw_dir, ANNOTATIONS.format(subtype))
    if not os.path.isfile(a_path):
        return rows, [], image_ids
    ann = read_annotations(a_path)
    missing = [r["question_id"] for r in rows if r["question_id"] not in ann]
    if missing:
        raise ValueError(f"{a_path}: no annotation for {len(missing)} question(s) of {q_path}, e.g. "
                         f"question_id {missing[0]!r} (questions and annotations of different releases?)")
    extra = set(ann) - {r["question_id"] for r in rows}
    if extra:
        qid = min(extra, key=str)
        raise ValueError(f"{ann[qid][0]}: question_id {qid!r} is not in {q_path}")
    mcs = []
    for r in rows:
        a = ann[r["question_id"]][1]
        r.update(answers=a["answers"], answer_type=a["answer_type"], question_type=a["question_type"])
        mcs.append(a["mc"])
    return rows, mcs, image_ids


def _vocab(counts, min_count, what):
    answers = sorted((a for a, n in counts.items() if n >= min_count), key=lambda a: (-counts[a], a))
    if not answers:
        raise ValueError(f"no answer occurs {min_count} times in {what}; lower --min_count")
    return {a: i for i, a in enumerate(answers)}


def convert_vqa_k(raw_dir, min_count=DEFAULT_MIN_COUNT, style="coco", karpathy_test=None):
    """ClipBERT's VQA files: ({"vqa_k_trainval", "vqa_k_test"[, "vqa_test", "vqa_test_dev"]: rows},
    trainval ans2label). ``vqa_k_test`` holds the val2014 questions on the Karpathy-test images
    (``karpathy_test``: their integer COCO ids), or all val2014 questions when it is None;
    ``vqa_k_trainval`` every other train2014/val2014 question. The vocabulary counts trainval only."""
    if min_count < 1:
        raise ValueError(f"--min_count must be >= 1, got {min_count}")
    for split in ("train", "val"):
        sub = SPLITS[split]
        for name in (QUESTIONS.format(sub), ANNOTATIONS.format(sub)):
            if not os.path.isfile(os.path.join(raw_dir, name)):
                raise ValueError(f"{os.path.join(raw_dir, name)}: file not found (vqa_k_trainval/vqa_k_test "
                                 f"need the train2014 and val2014 questions and annotations)")
    trainval, test, counts = [], [], Counter()
    for split in ("train", "val"):
        rows, mcs, image_ids = convert_split(raw_dir, SPLITS[split], style)
        for r, mc, img in zip(rows, mcs, image_ids):
            held = split == "val" and (karpathy_test is None or img in karpathy_test)
            (test if held else trainval).append(r)
            if not held:
                counts[mc] += 1
    if not test:
        raise ValueError(f"{raw_dir}: no val2014 question is on a Karpathy-test image (wrong split file?)")
    out = {"vqa_k_trainval": trainval, "vqa_k_test": test}
    for split, name in (("test", "vqa_test"), ("test_dev", "vqa_test_dev")):
        if os.path.isfile(os.path.join(raw_dir, QUESTIONS.format(SPLITS[split]))):
            out[name] = convert_split(raw_dir, SPLITS[split], style)[0]
    return out, _vocab(counts, min_count, "vqa_k_trainval")
