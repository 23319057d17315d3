import os

import numpy as np
import pytest

import npref
import nvfp4moe

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except Exception:  # not installed (CI's CPU machine), or a broken install
    HAVE_TORCH = False

HAVE_CUDA = HAVE_TORCH and torch.cuda.is_available() and nvfp4moe.cuda_available()

# Shape of the Python-written test checkpoint (npref.write_qwen3_checkpoint).
H, I, E, K = 64, 32, 8, 2


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    return npref.write_qwen3_checkpoint(str(tmp_path_factory.mktemp("qwen3")), hidden=H, intermediate=I,
                                        num_experts=E, top_k=K, num_layers=2, seed=1)


@pytest.fixture(scope="session")
def ckpt(ckpt_dir):
    c = nvfp4moe.Checkpoint(ckpt_dir)
    yield c
    c.close()


@pytest.fixture(scope="session")
def cpu_layer(ckpt):
    return nvfp4moe.MoeLayer(ckpt, ckpt.moe_layers[0], mode="w4a16", max_tokens=64, device="cpu")


@pytest.fixture(scope="session")
def reference(ckpt_dir, ckpt):
    return npref.Reference(ckpt_dir, ckpt.spec(ckpt.moe_layers[0]))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_report_header(config):
    return (f"nvfp4moe {nvfp4moe.__version__} from {os.path.dirname(nvfp4moe.__file__)}; "
            f"built_with_cuda={nvfp4moe.built_with_cuda} cuda_available={nvfp4moe.cuda_available()} "
            f"torch={'yes' if HAVE_TORCH else 'no'}")
