"""The shared assertions of conftest.py fail where they must: a helper that passes on
nothing would let every test built on it pass on nothing too."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import same, take


def batch(**over):
    b = {"input_ids": np.arange(6, dtype=np.int64).reshape(2, 3), "mask": np.ones(3, bool)}
    b.update(over)
    return b


def test_same_accepts_equal_batches_and_lists():
    same(batch(), batch())
    same([batch(), batch()], [batch(), batch()])
    same(batch(extra=None), batch(extra=None))


@pytest.mark.parametrize(
    "a, b, why",
    [
        ([], [], "no batches"),  # two empty epochs are no match
        ([batch()], [batch(), batch()], None),  # different lengths
        (batch(), batch(extra=np.zeros(1)), None),  # different keys
        (batch(), batch(input_ids=np.arange(6, dtype=np.int32).reshape(2, 3)), "input_ids"),
        (batch(), batch(input_ids=np.arange(6, dtype=np.int64).reshape(3, 2)), "input_ids"),
        (batch(), batch(input_ids=np.array([[0, 1, 2], [3, 4, 6]])), "input_ids"),
        (batch(extra=None), batch(extra=np.zeros(1)), "extra"),
    ],
)
def test_same_fails_on_any_difference(a, b, why):
    with pytest.raises(AssertionError, match=why):
        same(a, b)


class _Tensor:
    def __init__(self, a):
        self.a = a

    def numpy(self):
        return self.a


class _Epochs:
    """A loader stand-in: `sizes[i]` batches in epoch i, StopIteration after each."""

    def __init__(self, sizes):
        self.sizes, self.epoch, self.pos = list(sizes), 0, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos == self.sizes[self.epoch]:
            self.epoch, self.pos = self.epoch + 1, 0
            raise StopIteration
        self.pos += 1
        return {"x": _Tensor(np.full(1, 10 * self.epoch + self.pos))}


def test_take_crosses_epoch_ends():
    got = take(_Epochs([2, 3, 1]), 5)
    assert [int(b["x"][0]) for b in got] == [1, 2, 11, 12, 13]


def test_take_fails_on_an_empty_epoch():
    with pytest.raises(AssertionError, match="empty epoch after 2 of 4"):
        take(_Epochs([2, 0, 3]), 4)
