"""The WordPiece tokenizer cramnas trains for a pretraining corpus.

Everything here runs inside the Rust `tokenizers` library: normalisation, pre-tokenisation and
WordPiece. `trainer.data` decides *when* to train one (and caches it); this module only says *how*
it is made and how it is identified.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# The ids a trained tokenizer gives them are their positions here: [PAD]=0, [UNK]=1, [CLS]=2,
# [SEP]=3, [MASK]=4. A tokenizer loaded from a file may number them differently.
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}

# "cramming": NFKD, lower-case, strip accents, then drop whatever is still not ASCII (Geiping &
# Goldstein 2022). "none": the text as it is (a cased vocabulary).
NORMALIZATIONS = ("cramming", "none")

SUBWORD_PREFIX = "##"


def build_normalizer(normalization: str) -> normalizers.Normalizer | None:
    if normalization == "none":
        return None
    if normalization == "cramming":
        return normalizers.Sequence(
            [
                normalizers.NFKD(),
                normalizers.Lowercase(),
                # Needs the decomposed form from NFKD: it removes the combining marks.
                normalizers.StripAccents(),
                normalizers.Replace(Regex(r"[^\x00-\x7F]+"), ""),
            ]
        )
    raise ValueError(f"unknown normalization {normalization!r}; choose one of {', '.join(NORMALIZATIONS)}")


def train_wordpiece(texts: Iterable[str | list[str]], vocab_size: int, normalization: str) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer with exactly `vocab_size` entries.

    A corpus too small to fill the vocabulary is padded with `[unused0]`, `[unused1]`, ... (as
    BERT's own vocabulary is), so that token ids and the model's embedding table always agree.
    The result can still be larger than `vocab_size` when the corpus alphabet alone exceeds it.
    """
    tokenizer = Tokenizer(
        models.WordPiece(unk_token=SPECIAL_TOKENS["unk"], continuing_subword_prefix=SUBWORD_PREFIX)
    )
    tokenizer.normalizer = build_normalizer(normalization)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        continuing_subword_prefix=SUBWORD_PREFIX,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    _renumber_vocabulary(tokenizer, vocab_size)
    # [CLS] A [SEP] (B [SEP]) with segment ids, so that fine-tuning (GLUE) can encode sentence
    # pairs with this very tokenizer; pretraining packs sequences itself and bypasses this.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")],
    )
    tokenizer.decoder = decoders.WordPiece(prefix=SUBWORD_PREFIX)
    return tokenizer


def _renumber_vocabulary(tokenizer: Tokenizer, vocab_size: int) -> None:
    """Ids: the special tokens, then the learned tokens in sorted order, then [unusedN] padding.

    The trainer numbers tokens of equal frequency in hash-map order, which changes from run to
    run. WordPiece splits text by vocabulary membership only, never by id, so sorting changes no
    tokenisation and makes the ids reproducible.
    """
    specials = list(SPECIAL_TOKENS.values())
    learned = sorted(set(tokenizer.get_vocab()) - set(specials))
    padding = [f"[unused{i}]" for i in range(vocab_size - len(specials) - len(learned))]
    vocab = {token: index for index, token in enumerate(specials + learned + padding)}
    tokenizer.model = models.WordPiece(
        vocab, unk_token=SPECIAL_TOKENS["unk"], continuing_subword_prefix=SUBWORD_PREFIX
    )


def special_ids(tokenizer: Tokenizer) -> dict[str, int | None]:
    """Name ("pad", "unk", "cls", "sep", "mask") -> id, or None where the tokenizer lacks it."""
    return {name: tokenizer.token_to_id(token) for name, token in SPECIAL_TOKENS.items()}


def tokenizer_sha256(tokenizer: Tokenizer) -> str:
    """Identity of a tokenizer: its whole serialised form (vocabulary, normaliser, pre-tokeniser)."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
