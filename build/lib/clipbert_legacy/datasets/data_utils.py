"""ClipBERT's data helpers, legacy import surface: mk_input_group and the image transforms."""
import random

from clipbert_legacy.datasets.image_ops import ImageNorm, ImagePad, ImageResize, get_resize_size  # noqa: F401


def chunk_list(examples, chunk_size=2, pad_to_divisible=True):
    """Split into chunks of `chunk_size`; pad the last one with random.choices (with replacement)."""
    n = len(examples)
    chunks = [examples[i:i + chunk_size] for i in range(0, n, chunk_size)]
    if pad_to_divisible and n % chunk_size != 0:
        chunks[-1] = chunks[-1] + random.choices(examples, k=chunk_size - n % chunk_size)
    return chunks


def mk_input_group(key_grouped_examples, max_n_example_per_group=2, is_train=True,
                   example_unique_key=None):
    """{key: [examples]} -> [(key, chunk)] with chunks of `max_n_example_per_group` examples.

    In training the last chunk of each key is padded by sampling that key's examples with
    replacement; with `example_unique_key`, asserts that no example was lost.
    E.g. {v1: [1, 2, 3], v2: [4]}, 2 -> [(v1, [1, 2]), (v1, [3, x]), (v2, [4, 4])].
    """
    input_groups = []
    for k, examples in key_grouped_examples.items():
        for chunk in chunk_list(examples, chunk_size=max_n_example_per_group, pad_to_divisible=is_train):
            input_groups.append((k, chunk))
    if example_unique_key is not None:
        original = {e[example_unique_key] for v in key_grouped_examples.values() for e in v}
        grouped = {e[example_unique_key] for _, g in input_groups for e in g}
        assert original == grouped, "examples were lost while grouping"
    return input_groups


def flat_list_of_lists(lol):
    return [x for sub in lol for x in sub]
