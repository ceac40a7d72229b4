import torch.nn as nn


class CharRNN(nn.Module):
    """karpathy's char-rnn: characters -> embeddings -> a stacked LSTM -> next-character scores."""

    def __init__(self, vocab_size, hidden=64, layers=2, dropout=0.0):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, idx):
        x, _ = self.lstm(self.embedding(idx))
        return self.head(x)


def build(vocab_size, block_size, hidden=64, layers=2, dropout=0.0):
    # An RNN reads any length: block_size (the tokens per sample) sizes nothing here.
    return CharRNN(vocab_size, hidden, layers, dropout)
