"""``classification_metrics`` against values worked out by hand (scikit-learn's definitions)."""

import pytest

from aiayn.decoding.classifier import classification_metrics


def test_accuracy_macro_f1_and_confusion_by_hand():
    # gold 0 1 1 2, predicted 0 1 2 2: F1 of class 0 = 2·1/(1+1) = 1, class 1 = 2·1/(1+2) = 2/3,
    # class 2 = 2·1/(2+1) = 2/3; class 3 is in neither and is left out, as in scikit-learn's
    # f1_score(average="macro"): (1 + 2/3 + 2/3) / 3 = 77.78 (counting it as 0 would give 58.33)
    m = classification_metrics([0, 1, 1, 2], [0, 1, 2, 2], n_classes=4)
    assert m["accuracy"] == 75.0 and m["macro_f1"] == 77.78
    assert m["confusion"] == [[1, 0, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]


def test_a_class_missing_from_the_dev_set_does_not_lower_a_perfect_score():
    assert classification_metrics([0, 0, 1, 1], [0, 0, 1, 1], n_classes=3)["macro_f1"] == 100.0


def test_a_class_predicted_but_never_present_counts_zero():
    # gold 0 0, predicted 0 1: class 0 F1 = 2·1/(1+2) = 2/3, class 1 (predicted only) 0: mean 33.33
    assert classification_metrics([0, 0], [0, 1], n_classes=2)["macro_f1"] == 33.33


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="as many predictions as labels"):
        classification_metrics([0, 1], [0], n_classes=2)
