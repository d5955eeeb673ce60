"""The toy language: special ids, sizes, and the word-to-token permutation.

Plain Python, so configs can import the sizes without importing torch.
"""

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
N_SPECIAL = 3

N_WORDS = 12
TGT_VOCAB = N_SPECIAL + N_WORDS
MIN_WORDS, MAX_WORDS = 2, 4
MIN_FRAMES, MAX_FRAMES = 2, 4
MAX_SRC_LEN = MAX_WORDS * MAX_FRAMES
# BOS + one token per word + EOS
MAX_TGT_LEN = MAX_WORDS + 2


def perm(word):
    """The target token index of source word ``word`` (a bijection, since 5 and 12 are coprime)."""
    return (5 * word + 3) % N_WORDS


def target_tokens(words):
    """``[BOS] + translated words in reverse order + [EOS]``."""
    return [BOS_ID] + [N_SPECIAL + perm(w) for w in reversed(words)] + [EOS_ID]
