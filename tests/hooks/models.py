"""Tiny models for the dtr torch-layer tests. Each `make_<name>()` returns (model, batches, loss_fn)
where batches is a list of inputs for a few training steps; everything is seeded."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh(),
                      nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    batches = [(torch.randn(64, 32), torch.randint(0, 10, (64,))) for _ in range(3)]
    return m, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.b2 = nn.BatchNorm2d(16)
        self.c3 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)), inplace=True)
        x = F.max_pool2d(x, 2)
        x = F.relu(self.b2(self.c2(x)), inplace=True)
        x = F.max_pool2d(x, 2)
        x = F.relu(self.c3(x), inplace=True)
        return self.fc(x.flatten(1))


def cnn():
    torch.manual_seed(0)
    m = CNN()
    batches = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(3)]
    return m, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(32, 50)

    def forward(self, x):
        return self.out(self.enc(self.emb(x)))


def transformer():
    torch.manual_seed(0)
    m = Encoder()
    batches = [torch.randint(0, 50, (4, 12)) for _ in range(3)]
    return m, batches, lambda m, b: F.cross_entropy(m(b).reshape(-1, 50), b.roll(1, 1).reshape(-1))


class LSTMLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.cell = nn.LSTMCell(16, 32)
        self.out = nn.Linear(32, 40)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 32)
        c = torch.zeros(x.shape[0], 32)
        logits = []
        for t in range(x.shape[1]):
            h, c = self.cell(self.emb(x[:, t]), (h, c))
            logits.append(self.out(h))
        return torch.stack(logits, 1)


def lstm():
    torch.manual_seed(0)
    m = LSTMLM()
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        T = int(torch.randint(4, 8, (1,), generator=g))
        batches.append(torch.randint(0, 40, (4, T), generator=g))
    return m, batches, lambda m, b: F.cross_entropy(m(b[:, :-1]).reshape(-1, 40), b[:, 1:].reshape(-1))


class TreeLSTM(nn.Module):
    """Child-sum TreeLSTM over a random binary tree given as nested tuples of leaf ids."""
    def __init__(self, d=24):
        super().__init__()
        self.d = d
        self.emb = nn.Embedding(30, d)
        self.iou = nn.Linear(2 * d, 3 * d)
        self.f = nn.Linear(2 * d, 2 * d)
        self.out = nn.Linear(d, 5)

    def node(self, t):
        if isinstance(t, int):
            x = self.emb(torch.tensor([t]))
            return torch.tanh(x), torch.zeros(1, self.d)
        (hl, cl), (hr, cr) = self.node(t[0]), self.node(t[1])
        hh = torch.cat([hl, hr], 1)
        i, o, u = self.iou(hh).chunk(3, 1)
        fl, fr = torch.sigmoid(self.f(hh)).chunk(2, 1)
        c = torch.sigmoid(i) * torch.tanh(u) + fl * cl + fr * cr
        return torch.sigmoid(o) * torch.tanh(c), c

    def forward(self, tree):
        return self.out(self.node(tree)[0])


def random_tree(g, n):
    if n == 1:
        return int(torch.randint(0, 30, (1,), generator=g))
    k = int(torch.randint(1, n, (1,), generator=g))
    return (random_tree(g, k), random_tree(g, n - k))


def treelstm():
    torch.manual_seed(0)
    m = TreeLSTM()
    g = torch.Generator().manual_seed(2)
    batches = [(random_tree(g, int(torch.randint(4, 8, (1,), generator=g))), torch.tensor([i % 5]))
               for i in range(3)]
    return m, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.d1 = nn.Conv2d(1, 8, 3, padding=1)
        self.d2 = nn.Conv2d(8, 16, 3, padding=1)
        self.mid = nn.Conv2d(16, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.u1 = nn.Conv2d(16, 8, 3, padding=1)
        self.out = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        a = F.relu(self.d1(x))
        b = F.relu(self.d2(F.max_pool2d(a, 2)))
        b = F.relu(self.mid(b)) + b
        u = self.up(b)
        return self.out(F.relu(self.u1(torch.cat([u, a], 1))))


def unet():
    torch.manual_seed(0)
    m = UNet()
    batches = [torch.randn(2, 1, 16, 16) for _ in range(3)]
    return m, batches, lambda m, b: F.mse_loss(m(b), b)


def silu_cnn():
    """EfficientNet's and MobileNetV3's blocks in small: conv, batch norm, then SiLU or Hardswish
    in place, whose derivatives need the input they overwrite, so autograd saves a clone of it
    (Note [Copies of overwritten contents], runtime/mutation.cc)."""
    torch.manual_seed(0)
    layers, ch = [], 3
    for i, width in enumerate([16, 16, 32, 32, 32, 32]):
        act = nn.Hardswish(inplace=True) if i % 3 == 2 else nn.SiLU(inplace=True)
        layers += [nn.Conv2d(ch, width, 3, padding=1, stride=2 if i in (2, 4) else 1), nn.BatchNorm2d(width), act]
        ch = width
    m = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ch, 10))
    batches = [(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))) for _ in range(3)]
    return m, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer, "lstm": lstm,
          "treelstm": treelstm, "unet": unet, "silu_cnn": silu_cnn}
