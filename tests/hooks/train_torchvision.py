"""Trains a torchvision model, unmodified, for a few SGD steps with fixed seeds, and prints one
JSON line (real_training.py). test_torchvision_models.py runs it plainly and under
`python -m dtr --budget ...` and compares the two bit for bit.

Models are torchvision's own constructors (no pretrained weights: nothing is downloaded), or,
for the transformers, torchvision's VisionTransformer and SwinTransformer classes built from a
small config, dropout and stochastic depth switched on, as a user configures them."""
import argparse
import functools

import torch
import torchvision
from torchvision.models.swin_transformer import SwinTransformer
from torchvision.models.vision_transformer import VisionTransformer

from real_training import make_optimizer, train

# Built from a config: a 4-layer ViT and a 2-stage Swin, small enough for CI's CPU.
CONFIGS = {
    "vit_config": functools.partial(VisionTransformer, image_size=64, patch_size=8, num_layers=4,
                                    num_heads=4, hidden_dim=128, mlp_dim=512, dropout=0.1,
                                    attention_dropout=0.1, num_classes=10),
    "swin_config": functools.partial(SwinTransformer, patch_size=[4, 4], embed_dim=48, depths=[2, 2],
                                     num_heads=[3, 6], window_size=[4, 4], stochastic_depth_prob=0.2,
                                     num_classes=10),
}


def build(name):
    if name in CONFIGS:
        return CONFIGS[name]()
    kw = {"num_classes": 10, "weights": None}
    if name == "googlenet":
        kw.update(aux_logits=False, init_weights=True)
    return getattr(torchvision.models, name)(**kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = build(a.model).train()
    data = torch.Generator().manual_seed(1)

    def loss_of_step(model, step):
        x = torch.randn(a.batch, 3, a.size, a.size, generator=data)
        y = torch.randint(0, 10, (a.batch,), generator=data)
        return torch.nn.functional.cross_entropy(model(x), y)

    train(model, make_optimizer(a.optimizer, model), a.steps, loss_of_step)


if __name__ == "__main__":
    main()
