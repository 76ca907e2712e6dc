"""Metrics against values worked out by hand."""

import math

import pytest

from flexlamps.evals import metrics as m
from flexlamps.evals.stats import Stat, aggregate, single


def test_exact_matches():
    assert m.exact_match(" Paris ", "Paris\n") == 1
    assert m.exact_match("Paris", "paris") == 0
    assert m.exact_match("Paris", "") == 0
    assert m.quasi_exact_match("The Eiffel Tower!", "eiffel   tower") == 1
    assert m.quasi_exact_match("Eiffel Tower", "Eiffel Towers") == 0
    assert m.prefix_exact_match("Rome", " Rome is the capital") == 1
    assert m.prefix_exact_match("Rome", "It is Rome") == 0
    assert m.quasi_prefix_exact_match("the Rome", "rome, italy") == 1


def test_f1_is_over_word_sets():
    # gold -> {cat, sat, on, mat}; pred -> {cat, on, hat}: P = 2/3, R = 2/4, F1 = 4/7
    assert m.f1_score("the cat sat on the mat", "a cat on a hat") == pytest.approx(4 / 7)
    assert m.f1_score("cat", "dog") == 0.0
    assert m.f1_score("the", "a") == 0.0  # nothing left after normalization


def test_rouge_l():
    # LCS of [the cat sat on the mat] and [the cat on the mat] is 5: P = 1, R = 5/6, F = 10/11
    assert m.rouge_l("the cat sat on the mat", "The cat on the mat") == pytest.approx(10 / 11)


def test_gsm8k_final_number():
    assert m.final_number("Natalia sold 48 + 24 = 72 clips. The answer is 1,234.") == "1234"
    assert m.final_number_exact_match("The answer is 1,234.", "so she has 1234 eggs") == 1
    assert m.final_number_exact_match("The answer is -3.", "The answer is 3") == 0
    assert m.final_number_exact_match("The answer is 5.", "no number") == 0


def test_best_over_references():
    assert m.best_over_references("exact_match", ["Rome", "Roma"], "Roma") == 1
    assert m.best_over_references("f1_score", ["new york city", "nyc"], "york") == pytest.approx(0.5)


def test_multiple_choice_normalizations():
    lps, ntok, texts = [-4.0, -3.0], [2, 1], [" ab", " abcdefgh"]
    assert m.pick(m.choice_scores(lps, ntok, texts, "raw"), [0]) == (1, 0.0)
    assert m.choice_scores(lps, ntok, texts, "token") == [-2.0, -3.0]
    assert m.pick(m.choice_scores(lps, ntok, texts, "token"), [0]) == (0, 1.0)
    assert m.choice_scores(lps, ntok, texts, "char") == pytest.approx([-4 / 3, -3 / 9])
    assert m.pick(m.choice_scores(lps, ntok, texts, "char"), [1]) == (1, 1.0)
    with pytest.raises(ValueError):
        m.choice_scores(lps, ntok, texts, "bytes")


def test_ties_share_the_credit():
    assert m.pick([1.0, 1.0, 0.0], [1]) == (0, 0.5)


def test_perplexity_and_bits_per_byte():
    assert m.perplexity(-10 * math.log(2), 10) == pytest.approx(2.0)
    assert m.bits_per_byte(-8 * math.log(2), 4) == pytest.approx(2.0)


def test_stats_follow_helm():
    s = Stat("x").add(1).add(3)
    d = s.to_json()
    assert (d["count"], d["sum"], d["sum_squared"], d["min"], d["max"], d["mean"]) == (2, 4, 10, 1, 3, 2)
    assert d["variance"] == pytest.approx(1.0) and d["stddev"] == pytest.approx(1.0)
    # run level: one value per train trial, the mean over its instances
    per_instance = [(0, [single("em", 1)]), (0, [single("em", 0)]), (1, [single("em", 1)]), (1, [single("em", 1)])]
    (agg,) = aggregate(per_instance)
    assert (agg.count, agg.sum, agg.mean) == (2, 1.5, 0.75)
