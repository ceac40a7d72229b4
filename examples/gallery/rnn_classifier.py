import torch
import torch.nn as nn


class TextClassifier(nn.Module):
    """Token ids -> class scores: embeddings, a bidirectional LSTM, a GRU over its outputs."""

    def __init__(self, vocab_size, num_classes, embed_dim=16, hidden=16):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, tokens):
        x = self.embedding(tokens)
        x, _ = self.lstm(x)
        _, h = self.gru(x)
        return self.fc(torch.relu(h[-1]))


def build(vocab_size, num_classes, embed_dim=16, hidden=16):
    return TextClassifier(vocab_size, num_classes, embed_dim, hidden)
