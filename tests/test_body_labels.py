"""Axis labels and column names are honoured, body ids are validated.

Before, a Dataset with axis ["z", "y", "x"] or a DataFrame with columns z, y, x had its z data
stored as x, and duplicate or non-integer body ids were accepted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import nbody_dask

POS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


def _dataset(axis, body=(0, 1)):
    return xr.Dataset({"position": (("body", "axis"), POS),
                       "velocity": (("body", "axis"), POS / 10),
                       "mass": ("body", [1.0, 2.0])},
                      coords={"body": list(body), "axis": axis})


def test_dataset_axis_labels_are_honoured():
    ds = nbody_dask.as_bodies(_dataset(["z", "y", "x"]))
    assert list(ds.axis.values) == ["x", "y", "z"]
    assert ds.position.sel(body=0).values.tolist() == [3.0, 2.0, 1.0]
    assert ds.velocity.sel(body=1).values.tolist() == [0.6, 0.5, 0.4]
    same = nbody_dask.as_bodies(_dataset(["X", "Y", "Z"]))
    assert same.position.values.tolist() == POS.tolist()


def test_dataframe_columns_are_honoured():
    frame = pd.DataFrame(POS, columns=["z", "x", "y"])
    ds = nbody_dask.as_bodies({"position": frame, "velocity": np.zeros((2, 3)),
                               "mass": [1.0, 1.0]})
    assert ds.position.values.tolist() == [[2.0, 3.0, 1.0], [5.0, 6.0, 4.0]]
    unlabelled = pd.DataFrame(POS)  # columns 0, 1, 2: positional
    assert nbody_dask.make_bodies(unlabelled).position.values.tolist() == POS.tolist()


@pytest.mark.parametrize("labels", [["a", "b", "c"], ["x", "x", "y"]])
def test_other_labels_are_refused(labels):
    with pytest.raises(ValueError, match=r"position axis labels must be \['x', 'y', 'z'\]"):
        nbody_dask.as_bodies(_dataset(labels))
    with pytest.raises(ValueError, match="axis labels"):
        nbody_dask.make_bodies(pd.DataFrame(POS, columns=labels))


@pytest.mark.parametrize(("body", "error", "match"), [
    ((7, 7), ValueError, r"body ids must be unique; repeated: \[7\]"),
    ((0.5, 1.5), TypeError, "body ids must be integers, got dtype float64"),
    (("a", "b"), TypeError, "body ids must be integers"),
])
def test_bad_body_ids_are_refused(body, error, match):
    with pytest.raises(error, match=match):
        nbody_dask.as_bodies(_dataset(["x", "y", "z"], body=body))
    with pytest.raises(error, match=match):
        nbody_dask.make_bodies(POS, body=list(body))


def test_ids_are_checked_whether_ascending_or_not():
    three = np.zeros((3, 3))
    for ids in ([2, 5, 9], [9, 2, 5]):  # ascending ids are checked without a sort
        assert nbody_dask.make_bodies(three, body=ids).body.values.tolist() == ids
    for ids in ([2, 5, 5], [5, 2, 5]):
        with pytest.raises(ValueError, match=r"repeated: \[5\]"):
            nbody_dask.make_bodies(three, body=ids)


def test_body_ids_survive():
    ds = nbody_dask.make_bodies(POS, body=[10, 3])
    assert ds.body.values.tolist() == [10, 3]
