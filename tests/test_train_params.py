"""What the callback reads once at train begin (``mindspore/train_params.py``): here, which column holds the
sample ids ``callback.sample_ids`` names, and what a person is told when it cannot be found."""

from __future__ import annotations

import logging

import mindspore.dataset as ds
import numpy as np
import pytest

from mindwatch.mindspore.train_params import ids_column


def samples() -> ds.Dataset:
    """Eight samples of (sample_id, x, y), in batches of 4: a dataset that carries its ids beside the data."""
    rows = [(np.int64(1000 + i), np.ones(3, np.float32) * i, np.float32(i)) for i in range(8)]
    return ds.GeneratorDataset(rows, ["sample_id", "x", "y"], shuffle=False).batch(4)


def test_the_named_column_is_found_among_the_datasets_columns() -> None:
    assert ids_column("sample_id", samples()) == 0
    assert ids_column(None, samples()) == -1  # sample ids not asked for


def test_a_column_the_dataset_lacks_is_named_with_the_columns_it_has(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "mindwatch"):
        assert ids_column("ids", samples()) == -1
    (told,) = [r.getMessage() for r in caplog.records]
    assert "'ids', which the dataset lacks" in told and "['sample_id', 'x', 'y']" in told


class UnlistedColumns:
    """A dataset of one's own that cannot say its columns (as a wrapper around a pipeline that failed might)."""

    def get_col_names(self) -> list[str]:
        raise RuntimeError("the pipeline is not built")


def test_columns_that_cannot_be_read_are_told_as_such_not_as_none(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "mindwatch"):
        assert ids_column("sample_id", UnlistedColumns()) == -1
    (told,) = [r.getMessage() for r in caplog.records]
    assert "column names could not be read" in told and "the pipeline is not built" in told
    assert "lacks" not in told and "[]" not in told  # no claim that the dataset has no columns
