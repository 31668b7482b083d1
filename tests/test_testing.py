"""ogsgen.testing.assert_close: what it lets through and what it does not."""
import math

import pytest
import torch

from ogsgen.testing import assert_close

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("ref,actual", [
    ([1.0, 2.0, 4.0], [1.0, 2.0, 4.0]),
    ([1.0, 2.0, 4.0], [1.0, 2.01, 4.0]),                  # 0.25% of the largest magnitude
    ([1.0, NAN, -INF], [1.0, NAN, -INF]),                 # NaN and inf where the reference has them
    ([NAN, INF], [NAN, INF]),                             # no finite value to compare
])
def test_close_results_pass(ref, actual):
    assert_close(torch.tensor(ref), torch.tensor(actual))


@pytest.mark.parametrize("ref,actual,message", [
    ([1.0, 2.0, 4.0], [1.0, 2.5, 4.0], "max error 0.125"),
    ([1.0, 2.0, 4.0], [1.0, NAN, 4.0], "1 values differ in kind"),
    ([1.0, 2.0, INF], [1.0, 2.0, 4.0], "first at \\(2,\\): 4.0, reference inf"),      # inf made finite
    ([1.0, 2.0, INF], [1.0, 2.0, -INF], "reference inf"),
    ([1.0, NAN, 4.0], [1.0, 2.0, 4.0], "reference nan"),                            # a NaN lost
    ([1.0e9, INF, 4.0], [1.0, INF, 4.0], "max error 1"),                             # finite part still compared
])
def test_results_that_differ_fail(ref, actual, message):
    with pytest.raises(AssertionError, match=message):
        assert_close(torch.tensor(ref), torch.tensor(actual))
