"""Packing efficiency (real tokens over token slots) of TRL's best-fit-decreasing packing into 16k
sequences, next to padding each batch to its longest document (random batches, and batches of
similar lengths), on a log-normal length distribution with a median of ~1.8k tokens per answer (a
reasoning teacher's typical trace). Prints numbers only.

    python bench/packing_efficiency.py [--docs 20000] [--seq-length 16384] [--median 1800]
        [--sigma 0.6]
"""

import argparse
import time

import numpy as np
import pyarrow as pa


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--seq-length", type=int, default=16384)
    ap.add_argument("--median", type=float, default=1800)
    ap.add_argument("--sigma", type=float, default=0.6)
    ap.add_argument("--batch", type=int, default=8, help="documents per padded batch")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from datasets import Dataset
    from trl.data_utils import pack_dataset

    rng = np.random.default_rng(args.seed)
    lengths = np.clip(
        rng.lognormal(np.log(args.median), args.sigma, args.docs).astype(np.int64), 16, None
    )
    # packing truncates a document longer than a sequence
    kept = np.minimum(lengths, args.seq_length)
    offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    ids = pa.LargeListArray.from_arrays(
        pa.array(offsets), pa.array(np.zeros(offsets[-1], dtype=np.int32))
    )
    dataset = Dataset(pa.table({"input_ids": ids}))
    t0 = time.perf_counter()
    packed = pack_dataset(dataset, args.seq_length, strategy="bfd")
    seconds = time.perf_counter() - t0
    rows = len(packed)
    bfd = kept.sum() / (rows * args.seq_length)

    def padded(order: np.ndarray) -> float:
        slots = sum(
            args.batch * kept[order[i : i + args.batch]].max()
            for i in range(0, len(order), args.batch)
        )
        return kept.sum() / slots

    print(
        f"{args.docs} documents, log-normal lengths: median {np.median(lengths):.0f}, "
        f"mean {lengths.mean():.0f}, p99 {np.percentile(lengths, 99):.0f} tokens; "
        f"{np.mean(lengths > args.seq_length):.2%} longer than {args.seq_length}"
    )
    print(f"{'layout':<46}{'efficiency':>11}{'rows':>8}")
    label = f"BFD packing into {args.seq_length} (TRL pack_dataset)"
    print(f"{label:<46}{bfd:>11.4f}{rows:>8}   ({seconds:.2f} s)")
    batches = -(-args.docs // args.batch)
    label = f"pad to longest, random batches of {args.batch}"
    print(f"{label:<46}{padded(rng.permutation(args.docs)):>11.4f}{batches * args.batch:>8}")
    # Sorting by length pads little but makes every batch one length band (a training-order bias).
    label = f"pad to longest, length-sorted batches of {args.batch}"
    print(f"{label:<46}{padded(np.argsort(kept)):>11.4f}{batches * args.batch:>8}")


if __name__ == "__main__":
    main()
