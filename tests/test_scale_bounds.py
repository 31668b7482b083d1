"""The record of e8m0 scales' largest code (ogsgen.numerics.scale_bounds) and the hopper upcast it selects."""
import pytest
import torch

import ogsgen
from ogsgen.numerics import quantize_mx, swizzle_mx_values
from ogsgen.numerics.scale_bounds import scales_at_most_2
from ogsgen.runtime import launcher, matmul
from ogsgen.testing import assert_close


def test_a_record_covers_views_until_an_in_place_change():
    scales = torch.full((2, 4, 8), 120, dtype=torch.uint8)
    scales[1, 2, 3] = 128
    assert not scales_at_most_2(scales)                        # never measured
    assert ogsgen.bound_mx_scales(scales[0]) == 128            # a view measures its whole storage
    for view in (scales, scales[1], scales.mT, scales[:, 1:]):
        assert scales_at_most_2(view)
    scales[0, 0, 0] = 129                                      # any in-place change voids the record
    assert not scales_at_most_2(scales) and not scales_at_most_2(scales[1])
    assert ogsgen.bound_mx_scales(scales) == 129
    assert not scales_at_most_2(scales)                        # measured, but a scale is 4
    assert not scales_at_most_2(scales.clone())                # a copy is another tensor, unmeasured


def test_tensors_without_a_version_counter_are_not_recorded():
    with torch.inference_mode():
        scales = torch.full((4, 8), 127, dtype=torch.uint8)
    assert ogsgen.bound_mx_scales(scales) == 127
    assert not scales_at_most_2(scales)


def test_bound_mx_scales_takes_e8m0_bytes():
    with pytest.raises(TypeError, match="scales must be a uint8 tensor of e8m0 codes, got Tensor of torch.float32"):
        ogsgen.bound_mx_scales(torch.ones(4))
    with pytest.raises(TypeError, match="got list"):
        ogsgen.bound_mx_scales([127])


def test_matmul_ogs_upcasts_with_one_multiply_only_for_recorded_small_scales(monkeypatch, device):
    launched = []   # (none runs)
    monkeypatch.setattr(launcher, "launch", lambda kernel, grid, args, **options: launched.append(args))
    monkeypatch.setattr(matmul, "_has_wgmma", lambda x: False)
    values, scales = quantize_mx(torch.randn(256, 64, device=device).mT.contiguous(), "e2m1", axis=-1)  # K=256
    w, scales = swizzle_mx_values(values.mT, capability=(9, 0)), scales.mT.contiguous()
    x = torch.randn(8, 256, device=device).bfloat16()

    def one_multiply():
        ogsgen.matmul_ogs(x, w, None, precision_config=ogsgen.PrecisionConfig(weight_scale=scales))
        return launched.pop()["W_SCALES_AT_MOST_2"]
    assert one_multiply() is False
    assert ogsgen.bound_mx_scales(scales) <= 128
    assert one_multiply() is True
    scales.add_(0)                                             # in place: the record no longer holds
    assert one_multiply() is False


def _write_through_data(scales, new):
    scales.data[...] = new            # what a weight loader's param.data.copy_ does: no version bump


def _copy_into_data(scales, new):
    scales.data.copy_(new)


def _load_state_dict(scales, new):
    holder = torch.nn.Module()
    holder.register_buffer("scales", scales, persistent=True)
    holder.load_state_dict({"scales": new})


@pytest.mark.parametrize("write", [_write_through_data, _copy_into_data, _load_state_dict])
def test_scales_rewritten_after_the_record_give_the_product_of_the_new_scales(write, device):
    """A record of small scales (bound_mx_scales) that a later write outdates, with or without a version bump
    (a write through ``.data`` leaves the version counter as it was): the kernel still multiplies by the new
    scales, codes above 128 included."""
    x = torch.randn(16, 128, device=device).bfloat16()
    values, scales = quantize_mx(torch.randn(64, 128, device=device), "e2m1", axis=-1)      # (N, K): codes ~127
    w, scales = swizzle_mx_values(values.mT), scales.mT.contiguous()                       # (K // 2, N), (K // 32, N)
    assert ogsgen.bound_mx_scales(scales) <= 128
    new = scales.clone()
    new[1, 3] = 140                                             # a block's scale 2 ** 13
    new[2, 7] = 160                                             # and 2 ** 33 (still finite products)
    write(scales, new)
    assert torch.equal(scales, new)
    y = ogsgen.matmul_ogs(x, w, None, precision_config=ogsgen.PrecisionConfig(weight_scale=scales,
                                                                                 out_dtype=torch.float32))
    w_ref = ogsgen.numerics.dequantize_mx_torch(values, new.mT, "e2m1").mT.double()        # (K, N)
    want = x.double() @ w_ref
    assert_close(want.float(), y, maxtol=1e-5)
