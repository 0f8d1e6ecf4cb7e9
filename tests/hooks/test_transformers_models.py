"""Real models, unmodified: Hugging Face transformers' GPT-2, Llama, T5, Mixtral and Mamba built
from small configs as users build them for pretraining (SDPA attention, dropout, the output object
kept until the next step; Mixtral routes tokens to experts by data-dependent top-k, sort and
histc; Mamba runs its selective scan as a loop over positions, which thrashed out of memory at
half its activations before stop 78: runtime/README.md, "Dead constants behind the backward
pass"), trained plainly and under `python -m dtr --budget` at half their activations: losses and
the final state dict bit-identical, the budget never exceeded, activations recomputed
(real_models.py). Llama trains with AdamW, the others with SGD and momentum. scripts/setup.sh
installs transformers beside torch 2.14.1, where CI runs these."""
import os

import pytest

from conftest import HERE
from real_models import check_trains_at_half_its_activations

TRAIN = os.path.join(HERE, "train_transformers.py")

# (model, optimizer): each run takes a few seconds on one CPU thread, most of it imports.
MODELS = [("gpt2", "sgd"), ("llama", "adamw"), ("t5", "sgd"), ("mixtral", "sgd"), ("mamba", "sgd")]


@pytest.fixture(scope="module", autouse=True)
def _transformers():
    try:
        import transformers  # noqa: F401
    except Exception as e:
        pytest.skip(f"transformers does not import in this environment ({e}); scripts/setup.sh installs it "
                    "beside torch 2.14.1")


@pytest.mark.parametrize("model,optimizer", MODELS, ids=[m[0] for m in MODELS])
def test_trains_bit_identically_at_half_its_activations(model, optimizer):
    check_trains_at_half_its_activations(TRAIN, model, [model, "--optimizer", optimizer])
