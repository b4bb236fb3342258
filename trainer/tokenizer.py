"""The WordPiece tokenizer of a pretraining corpus: how it is made, identified, loaded and cached.

    tokenizer = trained_tokenizer(corpus, vocab_size=8192, normalization="cramming",
                                  sample_chars=TOKENIZER_SAMPLE_CHARS, root=cache_root())
    tokenizer = load_tokenizer_file(path, vocab_size=8192)     # or a given tokenizers JSON file

Everything runs inside the Rust `tokenizers` library: normalisation, pre-tokenisation and
WordPiece. A trained tokenizer learns from a bounded sample of the train documents (the first ones,
up to `sample_chars` characters; 100M by default) and is cached under <cache>/tokenizers/ by corpus
identity, vocabulary size, normalisation and sample size, so that a second preparation of the same
corpus at another sequence length does not train it again. A tokenizer file keeps its own
normaliser and must have exactly `vocab_size` tokens and the five BERT special tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from trainer.atomic import write_atomically
from trainer.cache import FORMAT_VERSION, digest
from trainer.corpus import HELD_OUT_FRACTION, Corpus, DataError, logged, text_batches

# The ids a trained tokenizer gives them are their positions here: [PAD]=0, [UNK]=1, [CLS]=2,
# [SEP]=3, [MASK]=4. A tokenizer loaded from a file may number them differently.
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}

# "cramming": NFKD, lower-case, strip accents, then drop whatever is still not ASCII (Geiping &
# Goldstein 2022). "none": the text as it is (a cased vocabulary).
NORMALIZATIONS = ("cramming", "none")

SUBWORD_PREFIX = "##"

TOKENIZER_SAMPLE_CHARS = 100_000_000


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


def pair_template(tokenizer: Tokenizer) -> processors.TemplateProcessing:
    """BERT's input layout, [CLS] A [SEP] for one text and [CLS] A [SEP] B [SEP] for a pair, B's
    tokens in segment 1: the one definition, for trained tokenizers and GLUE's copy of any other
    (`glue.data.prepare_tokenizer`). The tokenizer must have [CLS] and [SEP]."""
    cls, sep = SPECIAL_TOKENS["cls"], SPECIAL_TOKENS["sep"]
    return processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in (cls, sep)],
    )


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
    # So that fine-tuning (GLUE) can encode sentence pairs with this very tokenizer; pretraining
    # packs sequences itself and bypasses this.
    tokenizer.post_processor = pair_template(tokenizer)
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


def load_tokenizer_file(path: Path, vocab_size: int) -> Tokenizer:
    """A tokenizers JSON file, checked for the special tokens and the vocabulary size."""
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for unreadable or invalid files
        raise DataError(
            f"cannot read tokenizer file {path} ({error}); give a tokenizers JSON file"
        ) from error
    ids = special_ids(tokenizer)
    missing = [token for name, token in SPECIAL_TOKENS.items() if ids[name] is None]
    if missing:
        raise DataError(
            f"tokenizer file {path} lacks {' '.join(missing)}; "
            f"cramnas needs {' '.join(SPECIAL_TOKENS.values())}"
        )
    if tokenizer.get_vocab_size() != vocab_size:
        size = tokenizer.get_vocab_size()
        raise DataError(
            f"tokenizer file {path} has {size} tokens, not vocab_size={vocab_size}; pass vocab_size={size}"
        )
    # Packing needs whole documents, whatever the file was set up for.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def trained_tokenizer(
    corpus: Corpus, vocab_size: int, normalization: str, sample_chars: int, root: Path
) -> Tokenizer:
    """The tokenizer trained on `corpus`'s train documents, from <root>/tokenizers/ when cached."""
    key = digest(
        {
            "format_version": FORMAT_VERSION,
            "source": corpus.source.identity(),
            "vocab_size": vocab_size,
            "normalization": normalization,
            "sample_chars": sample_chars,
            "held_out_fraction": HELD_OUT_FRACTION,
        }
    )
    path = root / "tokenizers" / f"{key}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    train = corpus.documents.train
    with logged(f"trained a {vocab_size}-token WordPiece tokenizer on up to {sample_chars:,} characters"):
        tokenizer = train_wordpiece(_tokenizer_sample(train, sample_chars), vocab_size, normalization)
    if tokenizer.get_vocab_size() > vocab_size:
        needed = tokenizer.get_vocab_size()
        raise DataError(
            f"vocab_size={vocab_size} is smaller than the corpus alphabet, which alone needs "
            f"{needed} tokens; use vocab_size >= {needed}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, tokenizer.to_str())
    return tokenizer


def _tokenizer_sample(documents: datasets.Dataset, max_chars: int) -> Iterator[list[str]]:
    """The first documents, up to and including the one that reaches `max_chars` characters."""
    taken = 0
    for batch in text_batches(documents):
        for end, text in enumerate(batch, start=1):
            taken += len(text)
            if taken >= max_chars:
                yield batch[:end]
                return
        yield batch
