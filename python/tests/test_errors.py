"""Bad arguments surface as TypeError (dtype, not a tensor) or ValueError (shape, device, T > max_tokens,
routing, options, closed checkpoint) with the C++ message naming the argument."""
import numpy as np
import pytest

import nvfp4moe
from conftest import E, H, K


@pytest.fixture
def x():
    return np.zeros((4, H), np.float32)


@pytest.fixture
def logits():
    return np.zeros((4, E), np.float32)


def test_wrong_hidden_dtype(cpu_layer, logits):
    for dt in (np.float64, np.int32, np.float16):
        with pytest.raises(TypeError, match="hidden"):
            cpu_layer.forward(np.zeros((4, H), dt), router_logits=logits)


def test_wrong_routing_dtypes(cpu_layer, x):
    with pytest.raises(TypeError, match="router_logits"):
        cpu_layer.forward(x, router_logits=np.zeros((4, E), np.float64))
    with pytest.raises(TypeError, match="topk_ids"):
        cpu_layer.forward(x, topk_ids=np.zeros((4, K), np.int64), topk_weights=np.zeros((4, K), np.float32))
    with pytest.raises(TypeError, match="topk_weights"):
        cpu_layer.forward(x, topk_ids=np.zeros((4, K), np.int32), topk_weights=np.zeros((4, K), np.float64))


def test_wrong_out_dtype(cpu_layer, x, logits):
    with pytest.raises(TypeError, match="out"):
        cpu_layer.forward(x, router_logits=logits, out=np.zeros((4, H), np.int32))


def test_not_a_tensor(cpu_layer, logits):
    with pytest.raises(TypeError, match="hidden"):
        cpu_layer.forward("hello", router_logits=logits)
    with pytest.raises(TypeError, match="hidden"):
        cpu_layer.forward([[0.0] * H] * 4, router_logits=logits)


def test_wrong_hidden_shape(cpu_layer, logits):
    with pytest.raises(ValueError, match="hidden"):
        cpu_layer.forward(np.zeros((4, H + 16), np.float32), router_logits=logits)
    with pytest.raises(ValueError, match="hidden"):
        cpu_layer.forward(np.zeros((4, H, 1), np.float32), router_logits=logits, out=np.zeros((4, H), np.float32))


def test_wrong_routing_shapes(cpu_layer, x):
    with pytest.raises(ValueError, match="router_logits"):
        cpu_layer.forward(x, router_logits=np.zeros((4, E + 1), np.float32))
    with pytest.raises(ValueError, match="router_logits"):
        cpu_layer.forward(x, router_logits=np.zeros((3, E), np.float32))
    with pytest.raises(ValueError, match="topk"):
        cpu_layer.forward(x, topk_ids=np.zeros((4, K + 1), np.int32), topk_weights=np.zeros((4, K + 1), np.float32))


def test_expert_id_out_of_range(cpu_layer, x):
    ids = np.full((4, K), E, np.int32)
    try:
        cpu_layer.forward(x, topk_ids=ids, topk_weights=np.ones((4, K), np.float32))
    except ValueError as e:
        assert "topk_ids" in str(e)
    # ids are data: the library may also skip (not fail on) ids it cannot use; it must never crash


def test_routing_forms(cpu_layer, x, logits):
    with pytest.raises(ValueError):
        cpu_layer.forward(x)  # neither
    ids, w = np.zeros((4, K), np.int32), np.ones((4, K), np.float32)
    with pytest.raises(ValueError):
        cpu_layer.forward(x, router_logits=logits, topk_ids=ids, topk_weights=w)  # both
    with pytest.raises(ValueError):
        cpu_layer.forward(x, topk_ids=ids)  # ids without weights


def test_wrong_out_shape(cpu_layer, x, logits):
    with pytest.raises(ValueError, match="out"):
        cpu_layer.forward(x, router_logits=logits, out=np.zeros((4, H - 16), np.float32))
    with pytest.raises(ValueError, match="out"):
        cpu_layer.forward(x, router_logits=logits, out=np.zeros((5, H), np.float32))


def test_more_tokens_than_max_tokens(ckpt):
    layer = nvfp4moe.MoeLayer(ckpt, 0, max_tokens=3, device="cpu")
    with pytest.raises(ValueError, match="max_tokens|3"):
        layer.forward(np.zeros((4, H), np.float32), router_logits=np.zeros((4, E), np.float32))
    layer.forward(np.zeros((3, H), np.float32), router_logits=np.zeros((3, E), np.float32))


def test_bad_options(ckpt):
    with pytest.raises(ValueError, match="mode"):
        nvfp4moe.MoeLayer(ckpt, 0, mode="w8a8", device="cpu")
    with pytest.raises(ValueError, match="device"):
        nvfp4moe.MoeLayer(ckpt, 0, device="tpu")
    with pytest.raises(ValueError, match="device"):
        nvfp4moe.MoeLayer(ckpt, 0, device="cuda:x")
    with pytest.raises(ValueError, match="max_tokens"):
        nvfp4moe.MoeLayer(ckpt, 0, max_tokens=0, device="cpu")
    with pytest.raises(ValueError):
        nvfp4moe.MoeLayer(ckpt, 5, device="cpu")  # not a layer
    with pytest.raises(TypeError):
        nvfp4moe.MoeLayer(42, 0, device="cpu")


def test_device_spelling_is_strict(ckpt):
    # std::stoi alone took "cuda: 0" and "cuda:+0" as cuda:0 (refused before any device is touched)
    for bad in ("cuda: 0", "cuda:+0", "cuda:-1", "cuda:", "cuda:0 ", "cuda0", "cuda:0x1", "cuda:9999999999"):
        with pytest.raises(ValueError, match=r'device: expected "cpu", "cuda" or "cuda:N", got "'):
            nvfp4moe.MoeLayer(ckpt, 0, device=bad)


def test_int_arguments_out_of_range_are_named(ckpt):
    # were nanobind's generic "incompatible function arguments" (TypeError)
    with pytest.raises(ValueError, match=r"max_tokens: expected an int in \[1, 9223372036854775807\], got 9223372036854775808"):
        nvfp4moe.MoeLayer(ckpt, 0, max_tokens=2**63, device="cpu")
    with pytest.raises(ValueError, match=r"max_tokens: expected an int in \[1, .*\], got 0"):
        nvfp4moe.MoeLayer(ckpt, 0, max_tokens=0, device="cpu")
    with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 2147483647\], got 1099511627776"):
        nvfp4moe.MoeLayer(ckpt, 2**40, device="cpu")
    with pytest.raises(ValueError, match=r"layer: expected an int in \[0, 2147483647\], got 1099511627776"):
        ckpt.spec(2**40)
    with pytest.raises(TypeError, match="max_tokens: expected an int, got float"):
        nvfp4moe.MoeLayer(ckpt, 0, max_tokens=4.0, device="cpu")
    with pytest.raises(TypeError, match="layer: expected an int, got bool"):
        nvfp4moe.MoeLayer(ckpt, True, device="cpu")
    # numpy integers are still taken
    assert nvfp4moe.MoeLayer(ckpt, np.int64(0), max_tokens=np.int32(4), device="cpu").max_tokens == 4
    assert ckpt.spec(np.int64(0)).layer == 0


@pytest.mark.skipif(nvfp4moe.cuda_available(), reason="a CUDA device is present")
def test_cuda_layer_without_a_device(ckpt):
    with pytest.raises((ValueError, RuntimeError)):
        nvfp4moe.MoeLayer(ckpt, 0, device="cuda", max_tokens=4)


@pytest.mark.skipif(not nvfp4moe.cuda_available(), reason="needs a CUDA device")
def test_host_arrays_into_a_cuda_layer(ckpt, x, logits):
    layer = nvfp4moe.MoeLayer(ckpt, 0, device="cuda", max_tokens=4)
    with pytest.raises(ValueError, match="hidden|device|cuda"):
        layer.forward(x, router_logits=logits, out=np.zeros((4, H), np.float32))


def test_out_none_for_immutable_framework(cpu_layer, logits):
    class Wrapped:  # a DLPack-capable object that is not NumPy/torch/CuPy
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kwargs):
            return self.a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    x = Wrapped(np.zeros((4, H), np.float32))
    with pytest.raises(TypeError, match="out"):
        cpu_layer.forward(x, router_logits=logits)
    out = np.empty((4, H), np.float32)
    assert cpu_layer.forward(x, router_logits=logits, out=out) is out


def test_bad_stream(cpu_layer, x, logits):
    # a cudaStream_t is an int; anything else is refused naming the argument (not a bare std::bad_cast)
    with pytest.raises(ValueError, match="stream"):
        cpu_layer.forward(x, router_logits=logits, stream=-1)
    with pytest.raises(ValueError, match="stream"):
        cpu_layer.forward(x, router_logits=logits, stream=2**64)
    for bad in (object(), 1.5, "0", True):
        with pytest.raises(TypeError, match="stream"):
            cpu_layer.forward(x, router_logits=logits, stream=bad)
