"""The cached launcher's reuse of encoded TMA descriptors (ogsgen.runtime.launcher._EncodedDescriptors).

No GPU here: the encoder (``cuTensorMapEncodeTiled`` through Triton) is replaced by a function that records
what it encodes, and Triton 3.6's own descriptor-encoding wrapper runs around a launcher that records what it
is passed."""
from types import SimpleNamespace

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from ogsgen.runtime import launcher

SIGNATURE = {"X": "*bf16", "XDesc": "tensordesc<bf16[16, 64]>", "n": "i32", "BLOCK": "constexpr",
             "WDesc": "tensordesc<bf16[1, 64, 128]>", "k": "i32"}
LAYOUTS = [{"swizzle": 3, "elem_size": 2, "elem_type": 5, "block_size": [16, 64], "fp4_padded": False},
           {"swizzle": 3, "elem_size": 2, "elem_type": 5, "block_size": [1, 64, 128], "fp4_padded": False}]


def fake_encode(encoded):
    """An encoder that notes each (address, shape, strides) it encodes and returns Triton's expansion of it."""
    def encode(descriptor, layout):
        encoded.append((descriptor.base.data_ptr(), tuple(descriptor.shape), tuple(descriptor.strides)))
        return [("tensor map", descriptor.base.data_ptr(), layout["swizzle"]), *descriptor.shape,
                *descriptor.strides]
    return encode


def values(x, w, n=5):
    return [x, TensorDescriptor.from_tensor(x, [16, 64]), n, 64, TensorDescriptor.from_tensor(w, [1, 64, 128]), 7]


@pytest.fixture
def tensors():
    return torch.empty(32, 64, dtype=torch.bfloat16), torch.empty(2, 64, 128, dtype=torch.bfloat16)


@pytest.mark.skipif(launcher._RELEASE != (3, 6), reason="reads Triton 3.6's launcher wrapper")
def test_launches_pass_the_c_launcher_what_tritons_wrapper_passes(monkeypatch, tensors):
    from triton.backends.nvidia import driver
    passed = []
    run = SimpleNamespace(launch=driver.wrap_handle_tensordesc(lambda *args: passed.append(args), SIGNATURE, LAYOUTS),
                          global_scratch_size=0, profile_scratch_size=0)
    encoded = launcher._EncodedDescriptors.of(run)
    assert encoded is not None and encoded.positions == (1, 4)
    monkeypatch.setattr(driver, "make_tensordesc_arg", fake_encode([]))
    encoded.encode = fake_encode([])
    base = tuple(range(13))  # the launcher's own leading arguments (grid, stream, function, ...)
    run.launch(*base, *values(*tensors))
    encoded.c_launch(*base, *encoded.expand(values(*tensors)))
    assert passed[0] == passed[1]
    assert passed[0][13:15] == (tensors[0], ("tensor map", tensors[0].data_ptr(), 3))


@pytest.mark.skipif(launcher._RELEASE != (3, 6), reason="reads Triton 3.6's launcher wrapper")
def test_binaries_without_descriptors_or_with_scratch_take_tritons_launcher():
    from triton.backends.nvidia import driver
    plain = SimpleNamespace(launch=lambda *args: None, global_scratch_size=0, profile_scratch_size=0)
    assert launcher._EncodedDescriptors.of(plain) is None
    scratch = SimpleNamespace(launch=driver.wrap_handle_tensordesc(print, SIGNATURE, LAYOUTS), global_scratch_size=64,
                              profile_scratch_size=0)
    assert launcher._EncodedDescriptors.of(scratch) is None
    pointers = SimpleNamespace(launch=driver.wrap_handle_tensordesc(print, SIGNATURE, None), global_scratch_size=0,
                               profile_scratch_size=0)
    assert launcher._EncodedDescriptors.of(pointers) is None


def test_a_descriptor_is_encoded_once_per_address_shape_and_strides(tensors):
    x, w = tensors
    encoded = launcher._EncodedDescriptors(print, (1, 4), tuple(LAYOUTS))
    encoded.encode = fake_encode(noted := [])
    first = encoded.expand(values(x, w))
    assert encoded.expand(values(x, w)) == first and len(noted) == 2  # new descriptors of the same tensors
    other = torch.empty_like(x)
    expanded = encoded.expand(values(other, w))
    assert expanded[1] == ("tensor map", other.data_ptr(), 3) and len(noted) == 3
    encoded.expand(values(x[:16], w))  # the same address, fewer rows: another encoding
    assert noted[-1] == (x.data_ptr(), (16, 64), (64, 1))
    encoded.expand([x, TensorDescriptor(x, [32, 64], [64, 1], [16, 64], padding="nan"), 5, 64,
                    TensorDescriptor.from_tensor(w, [1, 64, 128]), 7])
    assert len(noted) == 5  # NaN padding: another encoding


def test_the_encodings_kept_per_descriptor_are_bounded(tensors):
    x, w = tensors
    encoded = launcher._EncodedDescriptors(print, (1, 4), tuple(LAYOUTS))
    encoded.encode = fake_encode([])
    rows = torch.empty(launcher._EncodedDescriptors._MAX_PER_DESCRIPTOR + 8, 64, dtype=torch.bfloat16)
    for row in range(rows.shape[0]):
        encoded.expand(values(rows[row:row + 1], w))
    assert all(len(cache) <= launcher._EncodedDescriptors._MAX_PER_DESCRIPTOR for cache in encoded.cache)


def test_a_cached_launch_runs_the_binary_directly_and_returns_its_relaunch(monkeypatch):
    """The first call of a key goes through ``kernel[grid]`` (compiles, launches); later calls of that key run the
    compiled binary's launcher directly, and both return the function a plan replays the launch with."""
    from triton.runtime.jit import JITFunction

    def body(X, n):
        pass
    kernel = JITFunction(body)  # not triton.jit, which gives the interpreter's function under TRITON_INTERPRET=1

    ran, compiles = [], []

    def run(*args):
        ran.append(args)
    compiled = SimpleNamespace(run=run, function="function", packed_metadata="metadata")

    def getitem(self, grid):
        return lambda **kwargs: compiles.append((grid, kwargs)) or compiled
    monkeypatch.setattr(type(kernel), "__getitem__", getitem)
    monkeypatch.setattr(launcher, "_FAST_PATH", True)
    monkeypatch.setattr(launcher.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launcher, "driver", SimpleNamespace(active=SimpleNamespace(get_current_stream=lambda d: 7)))
    monkeypatch.setattr(launcher, "_compiled", {})
    monkeypatch.setattr(launcher, "_launch_again", {})
    x = torch.empty(4)
    first = launcher.launch(kernel, (2, 1, 1), dict(X=x, n=5), num_warps=4)
    assert len(compiles) == 1 and not ran and launcher._compiled
    again = launcher.launch(kernel, (3, 1, 1), dict(X=x, n=5), num_warps=4)
    assert again is first and len(compiles) == 1
    assert ran == [(3, 1, 1, 7, "function", "metadata", None, None, None, x, 5)]
    first((4, 1, 1), [x, 5])  # as a plan replays it
    assert ran[-1][:3] == (4, 1, 1) and len(compiles) == 1
    launcher.launch(kernel, (2, 1, 1), dict(X=x, n=6), num_warps=4)  # another specialization value: compiles
    assert len(compiles) == 2
