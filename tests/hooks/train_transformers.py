"""Trains a Hugging Face transformers model built from a small config, unmodified, for a few
steps with fixed seeds, and prints one JSON line (real_training.py). test_transformers_models.py
runs it plainly and under `python -m dtr --budget ...` and compares the two bit for bit.

The models are the library's own classes with their defaults (SDPA attention, dropout on, the
output object the user keeps until the next step), built from a config as users build them for
pretraining: nothing is downloaded."""
import argparse

import torch
import transformers

from real_training import make_optimizer, train

VOCAB = 1000
# Small enough for CI's CPU, each a different family: GPT-2 (learned positions, Conv1D, tied
# head), Llama (rotary positions, RMSNorm, SwiGLU, grouped-query attention), T5 (encoder-decoder,
# relative position buckets, cross-attention), Mixtral (a mixture of experts: data-dependent
# routing by top-k, sort and histc into grouped matmuls) and Mamba (a selective state-space scan,
# on the CPU the library's sequential loop over positions reading slices of 2 MiB discretized
# tensors, whose gradients the backward pass sums in place: runtime/README.md, "Dead constants
# behind the backward pass").
CONFIGS = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=128, n_embd=128, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128)),
    "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0)),
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128)),
    "mamba": lambda: transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="the library's own activation checkpointing (gradient_checkpointing_enable)")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = CONFIGS[a.model]().train()
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    data = torch.Generator().manual_seed(1)
    held = {}

    def loss_of_step(model, step):
        ids = torch.randint(0, VOCAB, (a.batch, a.seq), generator=data)
        if a.model == "t5":
            labels = torch.randint(0, VOCAB, (a.batch, a.seq // 2), generator=data)
        else:
            labels = ids  # the models shift causal labels themselves
        # As a training loop does: `out = model(...)` lives until the next step replaces it.
        held["out"] = model(input_ids=ids, labels=labels)
        return held["out"].loss

    train(model, make_optimizer(a.optimizer, model), a.steps, loss_of_step)


if __name__ == "__main__":
    main()
