"""Models of the papers' training tasks, written with torch.nn only (the examples and the
time-to-accuracy benchmark train them).

- :func:`vgg16`, :func:`vgg19`: the CIFAR variants of VGG (3x3 conv stacks with BatchNorm,
  five max-pools down to 1x1x512, a 512-wide classifier), 10 or 100 classes.
- :func:`resnet20`: He et al.'s CIFAR ResNet-20 (a 3x3 stem of 16 channels, 3 stages x 3
  basic blocks of 16/32/64 channels, option-A shortcuts: strided identity padded with
  zeros, global average pooling, a linear head).
  ``in_channels`` and ``blocks_per_stage`` make the small ResNet of the ``digits_cnn`` task
  (one block per stage on 1-channel 8x8 digits).
- :class:`LSTMClassifier`: embedding, 2-layer LSTM, linear head on the last hidden state
  (the SparDL paper's IMDB sentiment task).
- :class:`LSTMLanguageModel`: word-level language model, embedding, 2-layer LSTM, a softmax
  over the vocabulary at every position (the ``wikitext2`` task and ``examples/train_lstm.py``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["VGG", "vgg16", "vgg19", "ResNetCifar", "resnet20", "LSTMClassifier", "LSTMLanguageModel", "MLP",
           "build"]

_VGG_CFG = {
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


class VGG(nn.Module):
    """CIFAR VGG; ``width`` scales every layer's channels (1.0: the paper's 64..512)."""

    def __init__(self, depth: int = 16, num_classes: int = 10, width: float = 1.0):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in _VGG_CFG[depth]:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                out = max(1, round(item * width))
                layers += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out),
                           nn.ReLU(inplace=True)]
                channels = out
        self.features = nn.Sequential(*layers)
        hidden = max(1, round(512 * width))
        self.classifier = nn.Sequential(nn.Linear(channels, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, hidden),
                                        nn.ReLU(inplace=True), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def vgg16(num_classes: int = 10, width: float = 1.0) -> VGG:
    return VGG(16, num_classes, width)


def vgg19(num_classes: int = 10, width: float = 1.0) -> VGG:
    return VGG(19, num_classes, width)


class _BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride
        self.pad = planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.pad == 0:
            return x
        x = x[:, :, ::self.stride, ::self.stride]  # option A: subsample, then zero-pad the new channels
        return F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetCifar(nn.Module):
    """He et al.'s CIFAR ResNet; ``width`` scales the 16/32/64 channels of the three stages;
    ``in_channels``: of the input images (3: RGB)."""

    def __init__(self, blocks_per_stage: int = 3, num_classes: int = 10, width: float = 1.0, in_channels: int = 3):
        super().__init__()
        c1, c2, c3 = (max(1, round(c * width)) for c in (16, 32, 64))
        self.conv = nn.Conv2d(in_channels, c1, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c1)
        stages, in_planes = [], c1
        for planes, stride in ((c1, 1), (c2, 2), (c3, 2)):
            for i in range(blocks_per_stage):
                stages.append(_BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c3, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.stages(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


def resnet20(num_classes: int = 10, width: float = 1.0) -> ResNetCifar:
    return ResNetCifar(3, num_classes, width)


class LSTMClassifier(nn.Module):
    def __init__(self, vocab_size: int, embed_dim: int = 64, hidden: int = 128, layers: int = 2,
                 num_classes: int = 2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(self.embedding(tokens))
        return self.head(h[-1])


LSTMState = tuple[torch.Tensor, torch.Tensor]


class LSTMLanguageModel(nn.Module):
    """Word-level language model: embedding ``embed_dim``, ``layers`` LSTM layers of ``hidden``,
    a linear softmax layer over the vocabulary at every position (dropout after the embedding
    and after the LSTM when ``dropout`` > 0). The embedding and the softmax are separate
    matrices (not tied), so the embedding's gradient is exactly zero in the rows of the words a
    batch does not hold.

    ``forward(tokens, state)``: ``tokens`` (batch, time) -> (logits (batch, time, vocabulary),
    the LSTM's state after the last position); ``state`` None starts from zeros. Truncated
    backpropagation through time passes the returned state, detached, to the next segment.
    """

    def __init__(self, vocab_size: int, embed_dim: int = 400, hidden: int = 400, layers: int = 2,
                 dropout: float = 0.0):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(hidden, vocab_size)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens: torch.Tensor, state: LSTMState | None = None) -> tuple[torch.Tensor, LSTMState]:
        out, state = self.lstm(self.drop(self.embedding(tokens)), state)
        return self.decoder(self.drop(out)), state


class MLP(nn.Module):
    def __init__(self, inputs: int, hidden: int, classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build(name: str, num_classes: int = 10, width: float = 1.0) -> nn.Module:
    return {"vgg16": vgg16, "vgg19": vgg19, "resnet20": resnet20}[name](num_classes, width)
