"""The built-in tasks: python-packages is balanced, grouped by source file and held out of
the embedded corpus; word-order swaps words of the same sentences and nothing else."""

from collections import Counter

import pytest

from pretextual.core.corpus import embedded_corpus
from pretextual.evaluation.builtin_tasks import PACKAGES, PER_CLASS, SWAPS, python_packages, word_order
from pretextual.evaluation.tasks import CLASSIFICATION, load_task
from pretextual.plugins.manager import Plugins


@pytest.fixture(scope="module")
def packages():
    return python_packages()


def test_python_packages_is_balanced_grouped_and_held_out(packages):
    assert Counter(packages.label) == {label: PER_CLASS for label in PACKAGES}
    assert len(set(packages.text)) == len(packages.text)
    for label, group in zip(packages.label, packages.group):
        assert group.split("/")[0] in PACKAGES[label]  # the group is the sentence's source file
    pretraining = {s for d in embedded_corpus() for s in d.sentences}
    assert not pretraining & set(packages.text)


def test_word_order_swaps_adjacent_words_of_half_the_sentences(packages):
    task = word_order()
    assert task.group == packages.group
    assert Counter(task.label) == {"original": len(packages.text) // 2,
                                   "swapped": len(packages.text) // 2}
    for text, source, label in zip(task.text, packages.text, task.label):
        words, before = text.split(), source.split()
        if label == "original":
            assert text == source
            continue
        # the same words, the first and last in place, 1 to SWAPS adjacent pairs exchanged
        assert sorted(words) == sorted(before) and words != before
        assert (words[0], words[-1]) == (before[0], before[-1])
        moved = [i for i, (a, b) in enumerate(zip(words, before)) if a != b]
        pairs = moved[::2]
        assert 1 <= len(pairs) <= SWAPS and moved == [j for i in pairs for j in (i, i + 1)]
        assert all(words[i] == before[i + 1] and words[i + 1] == before[i] for i in pairs)


def test_both_are_registered_by_name():
    plugins = Plugins()
    for name, classes in (("python-packages", len(PACKAGES)), ("word-order", 2)):
        task = load_task(name, plugins)
        assert task.kind == CLASSIFICATION and len(task.classes) == classes
        assert len(set(task.groups)) > 50
