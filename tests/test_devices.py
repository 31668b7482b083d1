"""The target layer: every capability decision reads one Target per device; GPUs the kernels do not serve are
refused by name."""
import pytest
import torch

from ogsgen import UnsupportedError, devices
from ogsgen.devices import Target


@pytest.mark.parametrize("capability,tma,wgmma,fp8,register_mma", [
    ((8, 0), False, False, False, True),   # A100
    ((8, 9), False, False, True, True),    # L40S
    ((9, 0), True, True, True, True),      # H100 / H200
    ((10, 0), True, False, True, True),    # B200: TMA, but no sm_90 wgmma
    ((7, 5), False, False, False, False),  # T4
])
def test_capabilities_follow_the_compute_capability(capability, tma, wgmma, fp8, register_mma):
    gpu = Target("gpu", capability, 132)
    assert (gpu.tma, gpu.wgmma, gpu.fp8, gpu.register_operand_mma) == (tma, wgmma, fp8, register_mma)


def test_rocm_is_refused_rather_than_read_as_hopper(monkeypatch):
    # An MI300 reports capability (9, 4) through torch.cuda: read as an NVIDIA capability it would pass for Hopper.
    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: pytest.fail("properties read on ROCm"))
    devices._target.cache_clear()
    try:
        with pytest.raises(UnsupportedError, match="NVIDIA GPUs.*ROCm 6.2.0"):
            devices.target(0)
    finally:
        devices._target.cache_clear()


def test_target_reads_the_device_once(monkeypatch):
    class Properties:
        name, major, minor, multi_processor_count = "H200", 9, 0, 132
    reads = []
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: reads.append(index) or Properties)
    devices._target.cache_clear()
    try:
        assert devices.target(torch.device("cuda", 3)) == Target("H200", (9, 0), 132)
        assert devices.target(3).sm_count == 132 and reads == [3]
    finally:
        devices._target.cache_clear()
