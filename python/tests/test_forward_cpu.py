"""MoeLayer.forward on the CPU backend with NumPy arrays, against the NumPy reference (and the CLI if built)."""
import numpy as np
import pytest

import npref
import nvfp4moe
from conftest import E, H, K

TOL = 1e-3  # relative L2 between two implementations (nvfp4-format.md section 9)


def test_router_logits_matches_reference(cpu_layer, reference, rng):
    x = rng.standard_normal((13, H)).astype(np.float32)
    logits = rng.standard_normal((13, E)).astype(np.float32)
    out = cpu_layer.forward(x, router_logits=logits)
    assert isinstance(out, np.ndarray) and out.shape == (13, H) and out.dtype == np.float32
    ids, w = reference.route(logits)
    assert npref.rel_l2(out, reference.forward(x, ids, w)) <= TOL


def test_topk_matches_reference(cpu_layer, reference, rng):
    T = 9
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32)
    ids[2, 1] = -1  # an unused slot
    w = rng.uniform(0.1, 1.0, size=(T, K)).astype(np.float32)
    out = np.empty((T, H), np.float32)
    got = cpu_layer.forward(x, topk_ids=ids, topk_weights=w, out=out)
    assert got is out
    assert npref.rel_l2(out, reference.forward(x, ids, w)) <= TOL


def test_logits_and_equivalent_topk_agree(cpu_layer, reference, rng):
    x = rng.standard_normal((5, H)).astype(np.float32)
    logits = rng.standard_normal((5, E)).astype(np.float32)
    ids, w = reference.route(logits)
    a = cpu_layer.forward(x, router_logits=logits)
    b = cpu_layer.forward(x, topk_ids=ids, topk_weights=w)
    assert npref.rel_l2(a, b) <= 1e-5


def test_deterministic_and_batch_invariant(cpu_layer, rng):
    x = rng.standard_normal((16, H)).astype(np.float32)
    logits = rng.standard_normal((16, E)).astype(np.float32)
    a = cpu_layer.forward(x, router_logits=logits)
    b = cpu_layer.forward(x, router_logits=logits)
    assert np.array_equal(a, b)
    one = cpu_layer.forward(x[7:8].copy(), router_logits=logits[7:8].copy())
    assert np.array_equal(one[0], a[7])


def test_bf16_rounding_of_f32_input(cpu_layer, rng):
    x = rng.standard_normal((4, H)).astype(np.float32)
    logits = rng.standard_normal((4, E)).astype(np.float32)
    assert np.array_equal(cpu_layer.forward(x, router_logits=logits),
                          cpu_layer.forward(npref.bf16_round(x), router_logits=logits))


def test_strided_inputs(cpu_layer, rng):
    """Non-contiguous views either give the contiguous result or are refused with a ValueError naming them."""
    big = rng.standard_normal((8, 2 * H)).astype(np.float32)
    logits = rng.standard_normal((8, E)).astype(np.float32)
    view = big[:, ::2]
    ref = cpu_layer.forward(np.ascontiguousarray(view), router_logits=logits)
    try:
        got = cpu_layer.forward(view, router_logits=logits)
    except ValueError as e:
        assert "hidden" in str(e)
    else:
        assert np.array_equal(got, ref)


def test_zero_tokens(cpu_layer):
    x = np.zeros((0, H), np.float32)
    try:
        out = cpu_layer.forward(x, router_logits=np.zeros((0, E), np.float32))
    except ValueError as e:  # T = 0 may be refused, but then with a message about it
        assert "hidden" in str(e) or "T" in str(e)
    else:
        assert out.shape == (0, H)


def test_call_is_forward(cpu_layer, rng):
    x = rng.standard_normal((2, H)).astype(np.float32)
    logits = rng.standard_normal((2, E)).astype(np.float32)
    assert np.array_equal(cpu_layer(x, router_logits=logits), cpu_layer.forward(x, router_logits=logits))


def test_w4a4_close_to_w4a16(ckpt, cpu_layer, rng):
    a4 = nvfp4moe.MoeLayer(ckpt, 0, mode="w4a4", max_tokens=8, device="cpu")
    assert a4.mode == "w4a4"
    x = rng.standard_normal((8, H)).astype(np.float32)
    logits = rng.standard_normal((8, E)).astype(np.float32)
    y4 = a4.forward(x, router_logits=logits)
    y16 = cpu_layer.forward(x, router_logits=logits)
    assert np.all(np.isfinite(y4))
    assert 0 < npref.rel_l2(y4, y16) < 0.5  # activation quantization changes the result, but not wildly


def test_second_layer_differs(ckpt, cpu_layer, rng):
    other = nvfp4moe.MoeLayer(ckpt, 1, max_tokens=4, device="cpu")
    x = rng.standard_normal((4, H)).astype(np.float32)
    logits = rng.standard_normal((4, E)).astype(np.float32)
    assert not np.array_equal(other.forward(x, router_logits=logits), cpu_layer.forward(x, router_logits=logits))


def test_threads_release_the_gil(cpu_layer, rng):
    import threading

    x = rng.standard_normal((32, H)).astype(np.float32)
    logits = rng.standard_normal((32, E)).astype(np.float32)
    ref = cpu_layer.forward(x, router_logits=logits)
    outs = [None] * 4

    def run(i):
        outs[i] = cpu_layer.forward(x, router_logits=logits)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert all(np.array_equal(o, ref) for o in outs)


@pytest.mark.skipif(not getattr(nvfp4moe._core, "have_generator", False), reason="no synthetic generator in build")
def test_generated_checkpoint_matches_reference(tmp_path, rng):
    path = nvfp4moe.generate_checkpoint(str(tmp_path / "gen"))
    c = nvfp4moe.Checkpoint(path)
    L = c.moe_layers[0]
    spec = c.spec(L)
    layer = nvfp4moe.MoeLayer(c, L, max_tokens=8, device="cpu")
    x = rng.standard_normal((8, spec.hidden)).astype(np.float32)
    ids = np.stack([rng.permutation(spec.num_experts)[: spec.top_k] for _ in range(8)]).astype(np.int32)
    w = rng.uniform(0.1, 1.0, size=ids.shape).astype(np.float32)
    try:
        ref = npref.Reference(path, spec, prefix=c.layers[[d["layer"] for d in c.layers].index(L)]["prefix"])
    except KeyError as e:
        pytest.skip(f"generator uses tensor names the NumPy reference does not know: {e}")
    if spec.shared_expert_gated:
        pytest.skip("gated shared expert is not in the NumPy reference")
    assert npref.rel_l2(layer.forward(x, topk_ids=ids, topk_weights=w), ref.forward(x, ids, w)) <= TOL
