"""Training throughput of CrammedBert against transformers' BertForMaskedLM, side by side.

Both models get the same layers, hidden size, heads and FFN parameters (our gated FFN at ffn_mult 4
has the parameter count of BERT's 4x GELU FFN), vocab 32768, seq 128, batch 32, AdamW, 25% of
tokens masked. Steps alternate between the two models in one process so that machine noise hits
both alike; we report the median of the timed steps after warm-up.

    python benchmarks/model_throughput.py [--layers 4 --hidden 256 --heads 4 --steps 10]
    python benchmarks/model_throughput.py --device cuda --layers 12 --hidden 768 --heads 12 --batch 128

On CUDA both models run under the trainer's bf16 autocast and fused AdamW, timed between
synchronizations.

CrammedBert predicts as the trainer does: K = round(0.25 T) positions per row, gathered
(`trainer.masking.mask_fixed_count`, static shapes); `cramnas_boolean` is the same model fed the
(B, T) labels of the earlier trainer (boolean indexing of the masked rows), side by side.

The last line is `tokens/s cramnas=<a> hf=<b> ratio=<a/b>`; `hf` is BertForMaskedLM at its own
defaults (dropout 0.1, SDPA attention, dense prediction), as BERT pretrains.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertForMaskedLM

from space.arch import ArchConfig
from trainer.device import autocast
from trainer.masking import IGNORE_INDEX, mask_fixed_count
from trainer.model import CrammedBert

SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}  # ids below 5: never drawn as tokens


def masked_batch(batch: int, seq: int, vocab: int, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """The model inputs of each way of predicting: the trainer's (fixed positions) and (B, T) labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    fixed = mask_fixed_count(ids, 0.25, special_ids=SPECIALS, vocab_size=vocab, generator=g)
    dense_labels = torch.full_like(ids, IGNORE_INDEX).scatter(1, fixed.positions, fixed.labels)
    return {"fixed": {"input_ids": fixed.input_ids, "labels": fixed.labels, "predict_at": fixed.positions},
            "labels": {"input_ids": fixed.input_ids, "labels": dense_labels}}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_fn(model: torch.nn.Module, inputs: dict[str, torch.Tensor], hf: bool, device: torch.device):
    # Fused AdamW for both: 6x faster than the foreach default on CPU, and transformers' Trainer
    # default (adamw_torch_fused), so the ratio measures the models, not the optimizers.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> float:
        synchronize(device)
        start = time.perf_counter()
        with autocast(device):
            loss = model(**inputs).loss if hf else model(**inputs)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        return time.perf_counter() - start

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model (after 2 warm-up)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    arch = ArchConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, ffn_mult=4.0,
                      vocab_size=args.vocab, max_seq_len=args.seq)
    hf_config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                           num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                           max_position_embeddings=args.seq)
    hf_no_dropout = BertConfig(**{**hf_config.to_dict(), "hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0})
    batches = {way: {k: t.to(device) for k, t in inputs.items()}
               for way, inputs in masked_batch(args.batch, args.seq, args.vocab, seed=0).items()}
    contenders = {
        "cramnas": (CrammedBert(arch).to(device).train(), False, "fixed"),
        "cramnas_boolean": (CrammedBert(arch).to(device).train(), False, "labels"),
        "hf": (BertForMaskedLM(hf_config).to(device).train(), True, "labels"),
        "hf_no_dropout": (BertForMaskedLM(hf_no_dropout).to(device).train(), True, "labels"),
    }
    steps = {name: step_fn(model, batches[way], hf, device) for name, (model, hf, way) in contenders.items()}
    params = {name: sum(p.numel() for p in model.parameters()) for name, (model, _, _) in contenders.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(args.steps + 2):
        for name, step in steps.items():
            elapsed = step()
            if i >= 2:
                times[name].append(elapsed)

    tokens = args.batch * args.seq
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    print(f"device={device} threads={torch.get_num_threads()} layers={args.layers} hidden={args.hidden} heads={args.heads} "
          f"vocab={args.vocab} seq={args.seq} batch={args.batch} steps={args.steps}")
    for name in steps:
        print(f"{name:>14}: {rate[name]:8.0f} tokens/s  params={params[name] / 1e6:.2f}M")
    print(f"ratio vs hf_no_dropout={rate['cramnas'] / rate['hf_no_dropout']:.2f}  "
          f"fixed positions vs boolean={rate['cramnas'] / rate['cramnas_boolean']:.2f}")
    print(f"tokens/s cramnas={rate['cramnas']:.0f} hf={rate['hf']:.0f} ratio={rate['cramnas'] / rate['hf']:.2f}")


if __name__ == "__main__":
    main()
