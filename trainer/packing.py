"""Tokenising and packing documents into MLM rows: the one long step of `trainer.data.prepare_data`.

The documents form one token stream with [SEP] between documents; the stream is cut into chunks
of seq_len - 2 tokens and every row is [CLS] chunk [SEP]. Only the incomplete last chunk is
dropped (< seq_len - 2 tokens in all). Documents that are empty after normalisation are skipped.
Tokenisation runs in Rust on all cores (`encode_batch_fast`, rayon); RAYON_NUM_THREADS caps the
threads, and the ids do not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
from tokenizers import Tokenizer

from trainer.corpus import text_batches
from trainer.tokenizer import special_ids


def pack_sequences(
    token_chunks: Iterable[np.ndarray], seq_len: int, cls_id: int, sep_id: int
) -> Iterator[np.ndarray]:
    """Cut one token stream, arriving in chunks of any length, into rows [CLS] + seq_len - 2
    stream tokens + [SEP]. Yields (n, seq_len) int64 blocks; the incomplete tail is dropped."""
    body = seq_len - 2
    carry = np.empty(0, dtype=np.int64)
    for chunk in token_chunks:
        stream = np.concatenate([carry, chunk])
        rows = len(stream) // body
        carry = stream[rows * body :]
        if rows:
            block = np.empty((rows, seq_len), dtype=np.int64)
            block[:, 0] = cls_id
            block[:, 1:-1] = stream[: rows * body].reshape(rows, body)
            block[:, -1] = sep_id
            yield block


@dataclass
class _StreamCount:
    documents: int = 0
    tokens: int = 0  # document tokens, without the [SEP]s between documents


def _token_stream(
    tokenizer: Tokenizer, text_batches: Iterable[list[str]], sep_id: int, count: _StreamCount
) -> Iterator[np.ndarray]:
    """All documents as one token stream with [SEP] between documents, one chunk per batch."""
    separator = np.array([sep_id], dtype=np.int64)
    for texts in text_batches:
        pieces = []
        # encode_batch_fast runs on all cores and skips the offsets packing does not need.
        for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False):
            ids = encoding.ids
            if not ids:  # nothing left after normalisation: no document, no [SEP]
                continue
            if count.documents:
                pieces.append(separator)
            pieces.append(np.asarray(ids, dtype=np.int64))
            count.documents += 1
            count.tokens += len(ids)
        if pieces:
            yield np.concatenate(pieces)


def write_packed(
    documents: datasets.Dataset,
    tokenizer: Tokenizer,
    seq_len: int,
    dtype: str,
    path: Path,
    label: str,
    max_rows: int | None = None,
) -> dict:
    """Tokenise, pack and write `documents` as raw rows to `path`; returns their counts."""
    ids = special_ids(tokenizer)
    count = _StreamCount()
    written = 0
    stream = _token_stream(
        tokenizer, text_batches(documents, progress=f"tokenising {label}"), ids["sep"], count
    )
    with open(path, "wb") as out:
        for block in pack_sequences(stream, seq_len, ids["cls"], ids["sep"]):
            if max_rows is not None:
                block = block[: max_rows - written]
            block.astype(dtype).tofile(out)
            written += len(block)
            if written == max_rows:
                break
    stats = {"documents": count.documents, "document_tokens": count.tokens, "sequences": written}
    if written != max_rows:  # the documents ran out: say what the last, incomplete row dropped
        stream_tokens = count.tokens + max(count.documents - 1, 0)
        stats["dropped_tail_tokens"] = stream_tokens - written * (seq_len - 2)
    return stats
