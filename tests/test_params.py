"""Parameter checks fail before heavy work, naming the parameter and the valid values."""
from __future__ import annotations

import pytest

from helpers import params


@pytest.mark.parametrize("value", [0, -1, 1.5, "4", True, None])
def test_batch_size_must_be_a_positive_integer(value):
    with pytest.raises(ValueError) as err:
        params.check_positive_int("batch_size", value)
    assert f"batch_size={value!r} is not valid" in str(err.value)
    assert "integer >= 1" in str(err.value)


def test_positive_int_accepts_and_honours_minimum():
    assert params.check_positive_int("max_new_tokens", 8) == 8
    assert params.check_positive_int("warmup", 0, minimum=0) == 0
    with pytest.raises(ValueError, match=r"max_new_tokens=0 is not valid"):
        params.check_positive_int("max_new_tokens", 0)


@pytest.mark.parametrize("values,bad", [([], None), ([1, 0, 4], "0"), ([1, -2], "-2"), ("1,2", None),
                                        ([1, 2.0], "2.0"), (3, None)])
def test_lists_of_sizes(values, bad):
    with pytest.raises(ValueError) as err:
        params.check_positive_ints("batch_sizes", values)
    message = str(err.value)
    assert message.startswith("batch_sizes=")
    if bad:
        assert f"{bad} is not an integer >= 1" in message
    else:
        assert "non-empty list of integers >= 1" in message


def test_lists_of_sizes_accepts_tuples():
    assert params.check_positive_ints("batch_sizes", (1, 4, 8)) == [1, 4, 8]


@pytest.mark.parametrize("prompts,match", [([], "prompts is empty"), ("", "every prompt must be"),
                                           (["ok", "  "], "every prompt must be"),
                                           (["ok", None], "contains None"), (None, "prompts is empty")])
def test_empty_prompts(prompts, match):
    with pytest.raises(ValueError, match=match):
        params.check_prompts("prompts", prompts)


def test_prompts_accepts_a_single_string():
    assert params.check_prompts("prompts", "hello") == ["hello"]


def test_choice_names_the_choices():
    with pytest.raises(ValueError, match=r"scheme='w4' is not valid; choose one of 'w8a16', 'w8a8'"):
        params.check_choice("scheme", "w4", ["w8a16", "w8a8"])
    assert params.check_choice("scheme", "w8a8", ("w8a16", "w8a8")) == "w8a8"


@pytest.mark.parametrize("value", [0, -0.5, "1", True])
def test_positive_float(value):
    with pytest.raises(ValueError, match=r"min_seconds=.* must be a number > 0"):
        params.check_positive_float("min_seconds", value)


def test_positive_float_allow_zero():
    assert params.check_positive_float("min_seconds", 0, allow_zero=True) == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        params.check_positive_float("min_seconds", -1, allow_zero=True)


def test_a_list_that_must_include_a_value():
    rule = params.ints_including(1)
    assert rule("batch_sizes", [4, 1, 2]) == [4, 1, 2]
    with pytest.raises(ValueError, match=r"batch_sizes=\[2, 4\] is not valid; it must include 1"):
        rule("batch_sizes", [2, 4])
    with pytest.raises(ValueError, match="batch_sizes"):
        rule("batch_sizes", [1, 0])
