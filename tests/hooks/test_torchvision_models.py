"""Real models, unmodified: torchvision's constructors (in-place SiLU/Hardswish, squeeze-excitation,
channel shuffle, dense concatenation, stochastic depth) and its ViT and Swin built from a config
(packed q/k/v attention, dropout, window shifts), trained with SGD and momentum plainly and under
`python -m dtr --budget` at half their activations: losses and the final state dict bit-identical,
the budget never exceeded, activations recomputed, and (under a budget that never binds) what dtr
holds after each step the same. torchvision imports beside torch 2.14.1 only (CI runs these on that wheel); on
2.13.0 they say why they cannot run."""
import os

import pytest

from conftest import HERE
from real_models import check_trains_at_half_its_activations

TRAIN = os.path.join(HERE, "train_torchvision.py")

# (model, image size, batch): sizes at which activations are most of the peak, so that half of
# them is a budget well below it; each run takes a few seconds on one CPU thread.
MODELS = [
    ("mobilenet_v3_small", 96, 8),
    ("efficientnet_b0", 96, 8),
    ("shufflenet_v2_x0_5", 96, 8),
    ("regnet_y_400mf", 96, 8),
    ("densenet121", 96, 8),
    ("vit_config", 64, 8),
    ("swin_config", 64, 8),
]
STEPS = 4


@pytest.fixture(scope="module", autouse=True)
def _torchvision():
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # ImportError, or torchvision's operator registration failing
        pytest.skip(f"torchvision does not import beside this torch ({e}); these run on 2.14.1")


@pytest.mark.parametrize("model,size,batch", MODELS, ids=[m[0] for m in MODELS])
def test_trains_bit_identically_at_half_its_activations(model, size, batch):
    check_trains_at_half_its_activations(
        TRAIN, model, [model, "--size", str(size), "--batch", str(batch), "--steps", str(STEPS)])
