"""The eight models of the budget sweep (bench/sweep.py), each seeded and deterministic, sized so
that one CPU training step (one thread) takes tens of milliseconds and activations, not
parameters, dominate the peak memory, so that a falling budget has something to evict.

Every model is a `BenchModel` with:
  build(device)            the nn.Module, seeded
  batches(n, device)       n seeded batches (dynamic models draw a new shape per batch)
  loss(module, batch)      the training loss of one batch
  stages(module, batch)    for chain-shaped models: (state0, [f_1, ..., f_N]) where the state is a
                           tensor or a tuple of tensors, f_i maps the state to the next one and f_N
                           returns the scalar loss; loss() is exactly their composition. The
                           sqrt(N) checkpointing and the Rotor-style stage profile use them.
                           None for models that are not chains (UNet, TreeLSTM).
  checkpoint_loss(m, b)    the loss under torch.utils.checkpoint (see checkpoint_chain), or None
  checkpoint_note          how it was checkpointed, or why it was not
  chain_note               what one chain stage is (granularity of the optimal baselines)
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tuc


def checkpoint_chain(state, fns, segments):
    """torch.utils.checkpoint_sequential's segmentation (len(fns) // segments stages per segment,
    every segment but the last one checkpointed, the last run normally) over a state that may be
    a tuple of tensors. It calls torch.utils.checkpoint.checkpoint with use_reentrant=False and
    preserve_rng_state=True (dropout masks are replayed): torch 1.13's checkpoint_sequential is
    reentrant only, and reentrant checkpointing gives the first segment's parameters no gradient
    when the batch does not require grad."""
    def run(start, end):
        def segment(*xs):
            s = xs if len(xs) > 1 else xs[0]
            for j in range(start, end + 1):
                s = fns[j](s)
            return s
        return segment

    size = len(fns) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        args = state if isinstance(state, tuple) else (state,)
        state = tuc.checkpoint(run(start, end), *args, use_reentrant=False, preserve_rng_state=True)
    args = state if isinstance(state, tuple) else (state,)
    return run(end + 1, len(fns) - 1)(*args)


def sqrt_segments(n_stages):
    return max(1, math.ceil(math.sqrt(n_stages)))


def classification_batches(n, device, input_shape, classes=10):
    """n seeded (input, label) batches: standard-normal inputs of `input_shape`, one label per row."""
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(*input_shape, generator=g).to(device),
             torch.randint(0, classes, (input_shape[0],), generator=g).to(device)) for _ in range(n)]


def token_batches(n, device, rows, lengths, vocab):
    """n seeded batches of `rows` token sequences for next-token prediction, each with its own
    length T drawn uniformly from `lengths` (lo, hi inclusive), T + 1 tokens so that the targets
    are the inputs shifted by one."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        T = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
        out.append(torch.randint(0, vocab, (rows, T + 1), generator=g).to(device))
    return out


class BenchModel:
    name = ""
    description = ""
    checkpoint_note = ""
    has_checkpoint = True
    chain_note = None

    def build(self, device):
        raise NotImplementedError

    def batches(self, n, device):
        raise NotImplementedError

    def stages(self, m, batch):
        return None

    def loss(self, m, batch):
        state, fns = self.stages(m, batch)
        for f in fns:
            state = f(state)
        return state

    def checkpoint_loss(self, m, batch):
        chain = self.stages(m, batch)
        if chain is None:
            return None
        state, fns = chain
        return checkpoint_chain(state, fns, sqrt_segments(len(fns)))


# ---------------------------------------------------------------- ResNet-style CNN
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)), inplace=True)
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)), inplace=True)


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), blocks_per_stage=2, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(blocks_per_stage):
                blocks.append(BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, classes)


class ResNetBench(BenchModel):
    name = "resnet"
    description = "ResNet-style CNN: 3x3 convs, BatchNorm, in-place ReLU, 6 basic blocks (16/32/64 channels), batch 8x3x32x32"
    checkpoint_note = "stem, 6 blocks, head = 8 stages in ceil(sqrt(8)) = 3 segments"
    chain_note = "stage = stem, one residual block, or pool+fc+loss (8 stages)"

    def build(self, device):
        torch.manual_seed(0)
        return ResNet().to(device)

    def batches(self, n, device):
        return classification_batches(n, device, (8, 3, 32, 32))

    def stages(self, m, batch):
        x, y = batch
        head = lambda h: F.cross_entropy(m.fc(F.adaptive_avg_pool2d(h, 1).flatten(1)), y)  # noqa: E731
        return x, [m.stem] + list(m.blocks) + [head]


# ---------------------------------------------------------------- DenseNet-style CNN
class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 producing `growth` new channels, concatenated to its input
    (so that a dense block is a chain of these layers over the growing feature map)."""
    def __init__(self, cin, growth):
        super().__init__()
        self.b1 = nn.BatchNorm2d(cin)
        self.c1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.b2 = nn.BatchNorm2d(4 * growth)
        self.c2 = nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False)

    def forward(self, x):
        y = self.c1(F.relu(self.b1(x)))
        y = self.c2(F.relu(self.b2(y)))
        return torch.cat([x, y], 1)


class Transition(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.b = nn.BatchNorm2d(cin)
        self.c = nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x):
        return F.avg_pool2d(self.c(F.relu(self.b(x))), 2)


class DenseNet(nn.Module):
    def __init__(self, growth=12, layers_per_block=5, blocks=3, classes=10):
        super().__init__()
        c = 2 * growth
        self.stem = nn.Conv2d(3, c, 3, 1, 1, bias=False)
        seq = []
        for b in range(blocks):
            for _ in range(layers_per_block):
                seq.append(DenseLayer(c, growth))
                c += growth
            if b != blocks - 1:
                seq.append(Transition(c, c // 2))
                c //= 2
        self.body = nn.ModuleList(seq)
        self.norm = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)


class DenseNetBench(BenchModel):
    name = "densenet"
    description = "DenseNet-BC-style CNN: 3 dense blocks of 5 bottleneck layers (growth 12), 2 transitions, batch 16x3x16x16"
    checkpoint_note = "stem, 15 dense layers, 2 transitions, head = 19 stages in ceil(sqrt(19)) = 5 segments"
    chain_note = "stage = one dense layer (its output is the growing concatenation), transition, stem or head (19 stages)"

    def build(self, device):
        torch.manual_seed(0)
        return DenseNet().to(device)

    def batches(self, n, device):
        # Batch 16: torch 1.13 runs 1x1 stride-1 convolutions of smaller batches on one thread
        # through its slow generic-BLAS path instead of oneDNN.
        return classification_batches(n, device, (16, 3, 16, 16))

    def stages(self, m, batch):
        x, y = batch
        head = lambda h: F.cross_entropy(  # noqa: E731
            m.fc(F.adaptive_avg_pool2d(F.relu(m.norm(h)), 1).flatten(1)), y)
        return x, [m.stem] + list(m.body) + [head]


# ---------------------------------------------------------------- Transformer with dropout
class Encoder(nn.Module):
    def __init__(self, vocab=128, d=64, heads=4, ff=128, layers=4, seq=32, dropout=0.1):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(d, heads, ff, dropout=dropout, batch_first=True) for _ in range(layers)])
        self.out = nn.Linear(d, vocab)


class TransformerBench(BenchModel):
    name = "transformer"
    description = "Transformer encoder LM: 4 layers, d=64, 4 heads, ff 128, dropout 0.1, batch 8x32 tokens"
    checkpoint_note = "embedding, 4 layers, head = 6 stages in ceil(sqrt(6)) = 3 segments (dropout replayed: preserve_rng_state)"
    chain_note = "stage = embedding, one encoder layer, or head+loss (6 stages)"

    def build(self, device):
        torch.manual_seed(0)
        return Encoder().to(device)

    def batches(self, n, device):
        g = torch.Generator().manual_seed(1)
        return [torch.randint(0, 128, (8, 33), generator=g).to(device) for _ in range(n)]

    def stages(self, m, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        emb = lambda t: m.emb(t) + m.pos  # noqa: E731
        head = lambda h: F.cross_entropy(m.out(h).reshape(-1, m.vocab), y.reshape(-1))  # noqa: E731
        return x, [emb] + list(m.layers) + [head]


# ---------------------------------------------------------------- UNet
def double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, widths=(8, 16, 32, 64)):
        super().__init__()
        self.down = nn.ModuleList()
        cin = 1
        for w in widths:
            self.down.append(double_conv(cin, w))
            cin = w
        self.ups = nn.ModuleList()
        self.up_convs = nn.ModuleList()
        for w in reversed(widths[:-1]):
            self.ups.append(nn.ConvTranspose2d(cin, w, 2, stride=2))
            self.up_convs.append(double_conv(2 * w, w))
            cin = w
        self.out = nn.Conv2d(cin, 1, 1)

    def forward(self, x, block=None):
        run = block or (lambda f, t: f(t))
        skips = []
        for i, d in enumerate(self.down):
            if i:
                x = F.max_pool2d(x, 2)
            x = run(d, x)
            skips.append(x)
        for up, conv, s in zip(self.ups, self.up_convs, reversed(skips[:-1])):
            x = run(conv, torch.cat([up(x), s], 1))
        return self.out(x)


class UNetBench(BenchModel):
    name = "unet"
    description = "UNet: 4 levels (8/16/32/64 channels), double 3x3 conv blocks, skip concatenations, batch 4x1x64x64, denoising loss"
    checkpoint_note = ("not a chain (skip connections): each of the 7 double-conv blocks checkpointed on its own "
                       "(torch.utils.checkpoint, non-reentrant)")

    def build(self, device):
        torch.manual_seed(0)
        return UNet().to(device)

    def batches(self, n, device):
        g = torch.Generator().manual_seed(1)
        out = []
        for _ in range(n):
            clean = torch.randn(4, 1, 64, 64, generator=g)
            out.append(((clean + 0.3 * torch.randn(4, 1, 64, 64, generator=g)).to(device), clean.to(device)))
        return out

    def loss(self, m, batch):
        return F.mse_loss(m(batch[0]), batch[1])

    def checkpoint_loss(self, m, batch):
        ck = lambda f, t: tuc.checkpoint(f, t, use_reentrant=False, preserve_rng_state=True)  # noqa: E731
        return F.mse_loss(m(batch[0], block=ck), batch[1])


# ---------------------------------------------------------------- LSTM language model
class LSTMLM(nn.Module):
    def __init__(self, vocab=128, d=32, hidden=128):
        super().__init__()
        self.vocab, self.hidden = vocab, hidden
        self.emb = nn.Embedding(vocab, d)
        self.cell = nn.LSTMCell(d, hidden)
        self.out = nn.Linear(hidden, vocab)


class LSTMBench(BenchModel):
    name = "lstm"
    description = "LSTM language model (LSTMCell unrolled, hidden 128), batch 32, sequence length drawn in [12, 24] per batch"
    checkpoint_note = "T time steps (each: cell, logits, loss term) in ceil(sqrt(T)) segments, T varies per batch"
    chain_note = "stage = one time step carrying (h, c, loss sum); T stages, T varies per batch"

    def build(self, device):
        torch.manual_seed(0)
        return LSTMLM().to(device)

    def batches(self, n, device):
        return token_batches(n, device, 32, (12, 24), 128)

    def stages(self, m, batch):
        T = batch.shape[1] - 1
        z = torch.zeros(batch.shape[0], m.hidden, device=batch.device)

        def step(t):
            def f(state):
                h, c, total = state
                h, c = m.cell(m.emb(batch[:, t]), (h, c))
                total = total + F.cross_entropy(m.out(h), batch[:, t + 1], reduction="sum")
                if t == T - 1:
                    return total / (T * batch.shape[0])
                return h, c, total
            return f

        return (z, z, torch.zeros((), device=batch.device)), [step(t) for t in range(T)]


# ---------------------------------------------------------------- word-level LM: nn.LSTM, large vocabulary
class WordLM(nn.Module):
    """Written the way PyTorch's word_language_model example writes it: embedding, dropout, a
    2-layer nn.LSTM over the whole sequence in one call (inter-layer dropout inside it), dropout,
    and a decoder to the whole vocabulary, whose logits for every position are the largest
    activations of the step. The LSTM is narrow so that the step stays near 60 ms on one thread:
    the head's cost grows with hidden x vocabulary. As in real LMs, the head sets the memory floor:
    the log-softmax backward holds three logits-sized tensors at once. On the CPU nn.LSTM runs as
    one aten::mkldnn_rnn_layer per layer (oneDNN), whose fourth output, a training workspace,
    exists only while grad mode is on."""
    def __init__(self, vocab=8192, d=64, hidden=64, layers=2, dropout=0.2):
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.drop = nn.Dropout(dropout)
        self.rnn = nn.LSTM(d, hidden, num_layers=layers, dropout=dropout, batch_first=True)
        self.out = nn.Linear(hidden, vocab)


class WordLMBench(BenchModel):
    name = "lm"
    description = ("word-level LSTM LM: embedding 64, nn.LSTM (2 layers, hidden 64, dropout 0.2) in one call, "
                   "8192-word cross-entropy head over all positions, batch 16, sequence length drawn in [24, 40] per batch")
    checkpoint_note = ("nn.LSTM and the head+loss each checkpointed on its own (torch.utils.checkpoint, "
                       "non-reentrant, dropout replayed): the head's logits-sized tensors are recomputed, not avoided")
    chain_note = "stage = embedding+dropout, the whole nn.LSTM+dropout, or head+loss (3 stages)"

    def build(self, device):
        torch.manual_seed(0)
        return WordLM().to(device)

    def batches(self, n, device):
        return token_batches(n, device, 16, (24, 40), 8192)

    def stages(self, m, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        emb = lambda t: m.drop(m.emb(t))  # noqa: E731
        rnn = lambda h: m.drop(m.rnn(h)[0])  # noqa: E731
        head = lambda h: F.cross_entropy(m.out(h).reshape(-1, m.vocab), y.reshape(-1))  # noqa: E731
        return x, [emb, rnn, head]

    def checkpoint_loss(self, m, batch):
        # sqrt(3) segments would checkpoint only the embedding; what real code checkpoints here
        # is the recurrent stack and the head.
        state, (emb, rnn, head) = self.stages(m, batch)
        ck = lambda f, t: tuc.checkpoint(f, t, use_reentrant=False, preserve_rng_state=True)  # noqa: E731
        return ck(head, ck(rnn, emb(state)))


# ---------------------------------------------------------------- TreeLSTM
class TreeLSTM(nn.Module):
    """Binary child-sum TreeLSTM; every step parses its batch with one fresh random tree shape."""
    def __init__(self, vocab=256, d=64, classes=5):
        super().__init__()
        self.d = d
        self.emb = nn.Embedding(vocab, d)
        self.leaf = nn.Linear(d, 2 * d)
        self.iou = nn.Linear(2 * d, 3 * d)
        self.f = nn.Linear(2 * d, 2 * d)
        self.out = nn.Linear(d, classes)

    def node(self, tree, tokens):
        if isinstance(tree, int):
            h, c = self.leaf(self.emb(tokens[:, tree])).chunk(2, 1)
            return torch.tanh(h), c
        (hl, cl), (hr, cr) = self.node(tree[0], tokens), self.node(tree[1], tokens)
        hh = torch.cat([hl, hr], 1)
        i, o, u = self.iou(hh).chunk(3, 1)
        fl, fr = torch.sigmoid(self.f(hh)).chunk(2, 1)
        c = torch.sigmoid(i) * torch.tanh(u) + fl * cl + fr * cr
        return torch.sigmoid(o) * torch.tanh(c), c


def random_tree(g, lo, n):
    """A random binary tree over leaves lo..lo+n-1 (nested pairs), split points uniform."""
    if n == 1:
        return lo
    k = int(torch.randint(1, n, (1,), generator=g))
    return (random_tree(g, lo, k), random_tree(g, lo + k, n - k))


class TreeLSTMBench(BenchModel):
    name = "treelstm"
    description = "TreeLSTM (binary, d=64) over a fresh random tree shape of 16-32 leaves per step, batch 32 sentences"
    checkpoint_note = "n/a: the graph is a different random tree every step, not a sequence of segments"
    has_checkpoint = False

    def build(self, device):
        torch.manual_seed(0)
        return TreeLSTM().to(device)

    def batches(self, n, device):
        g = torch.Generator().manual_seed(1)
        out = []
        for _ in range(n):
            leaves = int(torch.randint(16, 33, (1,), generator=g))
            tree = random_tree(g, 0, leaves)
            out.append((tree, torch.randint(0, 256, (32, leaves), generator=g).to(device),
                        torch.randint(0, 5, (32,), generator=g).to(device)))
        return out

    def loss(self, m, batch):
        tree, tokens, y = batch
        return F.cross_entropy(m.out(m.node(tree, tokens)[0]), y)

    def checkpoint_loss(self, m, batch):
        return None


# ---------------------------------------------------------------- deep linear chain
class LinearChain(nn.Module):
    def __init__(self, width=32, depth=64, classes=10):
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)])
        self.fc = nn.Linear(width, classes)


class ChainBench(BenchModel):
    name = "chain"
    description = "deep linear chain: 64 x (Linear 32->32, tanh), batch 512"
    checkpoint_note = "64 layers + head = 65 stages in ceil(sqrt(65)) = 9 segments"
    chain_note = "stage = one Linear+tanh layer, or head+loss (65 stages)"

    def build(self, device):
        torch.manual_seed(0)
        return LinearChain().to(device)

    def batches(self, n, device):
        return classification_batches(n, device, (512, 32))

    def stages(self, m, batch):
        x, y = batch
        head = lambda h: F.cross_entropy(m.fc(h), y)  # noqa: E731
        return x, list(m.layers) + [head]


MODELS = {b.name: b for b in (ResNetBench(), DenseNetBench(), TransformerBench(), UNetBench(), LSTMBench(),
                              WordLMBench(), TreeLSTMBench(), ChainBench())}


def get(name):
    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]
