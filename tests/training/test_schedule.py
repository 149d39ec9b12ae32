"""Learning-rate schedules against hand-computed values."""

import math

import pytest

from aiayn.errors import ConfigError
from aiayn.training.recipe import load_recipe
from aiayn.training.schedule import Schedule


def test_noam_is_the_paper_formula():
    s = Schedule("noam", peak=1.0, warmup=4000, d_model=512)
    for step in (1, 100, 4000, 4001, 100000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert abs(s(step) - expected) < 1e-15
    assert max(range(1, 10000, 7), key=s) in range(3990, 4010)  # peak at warm-up
    assert abs(s(4000) - 512**-0.5 * 4000**-0.5) < 1e-15  # ≈ 7.0e-4
    assert Schedule("noam", peak=2.0)(10) == 2 * Schedule("noam")(10)


def test_inverse_sqrt_constant_and_cosine():
    inv = Schedule("inverse_sqrt", peak=5e-3, warmup=100)
    assert inv(50) == pytest.approx(2.5e-3) and inv(100) == pytest.approx(5e-3)
    assert inv(400) == pytest.approx(2.5e-3)
    const = Schedule("constant", peak=1e-3, warmup=10)
    assert const(5) == pytest.approx(5e-4) and const(1000) == 1e-3
    cos = Schedule("cosine", peak=1e-3, warmup=100, min_lr=1e-4, decay_steps=2000)
    assert cos(50) == pytest.approx(5e-4) and cos(100) == pytest.approx(1e-3)
    mid = 100 + (2000 - 100) // 2
    assert cos(mid) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 950 / 1900)) * 9e-4)
    assert cos(2000) == 1e-4 and cos(5000) == 1e-4


def test_unknown_schedule():
    with pytest.raises(ValueError, match="schedule='linear' is not one of"):
        Schedule("linear")


def test_a_time_budget_moves_the_cosine_to_the_larger_fraction():
    cos = Schedule("cosine", peak=1e-3, warmup=100, min_lr=1e-4, decay_steps=2000)
    assert cos(500, budget_used=0.0) == cos(500)  # no budget: by steps alone
    assert cos(500, budget_used=0.5) == pytest.approx(cos(1000))  # half the budget: half the decay
    assert cos(1500, budget_used=0.5) == cos(1500)  # the steps are further along: they decide
    assert cos(10, budget_used=1.0) == 1e-4 and cos(10, budget_used=3.0) == 1e-4  # annealed at the end
    assert cos(10, budget_used=0.01) == pytest.approx(1e-3 * 20 / 100)  # warm-up by time, too


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["warmup=100", "max_steps=100"], "warmup=100 is not below max_steps=100, where the cosine ends"),
        (["warmup=600", "max_steps=8000", "decay_steps=500"], "warmup=600 is not below decay_steps=500"),
        (["warmup=600", "max_steps=120", "horizon=budget", "max_minutes=5"], "not below max_steps=120"),
    ],
)
def test_a_cosine_that_would_end_before_its_warmup_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, ["schedule=cosine", *overrides])
    load_recipe(None, ["schedule=constant", *overrides[:2]])  # no end to reach
