#!/usr/bin/env python3
"""Golden values for tests/data/test_numpy_rng.cpp and tests/data/test_mock_dataset.cpp.

A small pure-Python + numpy reference of Megatron-LM's mock GPT data pipeline, written from
SPEC-MEGATRON.md §4-§5 and read against Megatron-LM commit d7288711 (MLM-pin):
  - megatron/core/datasets/gpt_dataset.py: MockGPTLowLevelDataset, GPTDataset
    (_get_num_epochs, separate_final_epoch rule, _build_document_index, _build_shuffle_index,
    _query_document_sample_shuffle_indices)
  - megatron/core/datasets/helpers.cpp: build_sample_idx (re-written here as a Python loop)
  - megatron/core/datasets/blended_megatron_dataset_config.py: parse_and_normalize_split,
    convert_split_vector_to_split_matrix; blended_megatron_dataset_builder.py: int(round(b*N)).
The RNGs are numpy's own (default_rng, RandomState), so the C++ re-implementation is checked
against real numpy. build_sample_idx below was checked equal to Megatron's own helpers.cpp
(d7288711, compiled with pybind11) on every dataset printed here and on seq 100 / 2,000,000 samples.

Run: python3 scripts/mock_data_golden.py      (needs numpy; not needed by CI: the C++ tests embed
the printed values). The values in the tests were produced with numpy 2.4.6. Run by a python3 without
numpy (a venv's), it re-runs itself under /usr/bin/python3 when that one has numpy (script_errors.py).
"""
import functools
import os
import re
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # script_errors.py beside this script
import script_errors  # noqa: E402

try:
    import numpy
except ImportError:
    numpy = None  # main() re-runs the script where numpy is, or says what to install

PROG = "mock_data_golden.py"

MASK64 = (1 << 64) - 1


def fnv1a(tokens):
    """FNV-1a 64 over the tokens as uint32 words (one xor/multiply per token)."""
    h = 0xCBF29CE484222325
    for t in tokens:
        h ^= int(t) & 0xFFFFFFFF
        h = (h * 0x100000001B3) & MASK64
    return h


# ---- Megatron reference ----------------------------------------------------------------------------
def split_matrix(split):
    w = list(map(float, re.findall(r"[.0-9]+", split)))
    w = w + [0.0] * (3 - len(w))
    w = (numpy.array(w, dtype=numpy.float64) / numpy.sum(numpy.array(w, dtype=numpy.float64))).tolist()
    exp = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *w])
    return [None if e1 <= e0 else (e0, e1) for e0, e1 in zip(exp[:-1], exp[1:])]


def split_ranges(split, n):
    return [None if b is None else (int(round(b[0] * float(n))), int(round(b[1] * float(n))))
            for b in split_matrix(split)]


class MockLowLevel:
    def __init__(self, vocab_size, eod):
        self.vocab_size, self.eod = vocab_size, eod
        self.sequence_lengths = numpy.random.default_rng(seed=0).integers(
            low=1, high=4096, size=100000, dtype=numpy.int32)

    def get(self, idx, offset=0, length=None):
        n = self.sequence_lengths[idx]
        doc = numpy.int64(numpy.concatenate([(numpy.arange(n - 1) + 1) % self.vocab_size, [self.eod]]))
        if length is None:
            length = n - offset
        return doc[offset:offset + length]


class TableLowLevel:
    """Generic test data: sequence i has token (i*1000 + k) at offset k."""

    def __init__(self, lengths):
        self.sequence_lengths = numpy.asarray(lengths, dtype=numpy.int32)

    def get(self, idx, offset=0, length=None):
        n = int(self.sequence_lengths[idx])
        if length is None:
            length = n - offset
        return numpy.arange(offset, offset + length, dtype=numpy.int64) + 1000 * int(idx)


def build_document_index(documents, num_epochs, rs, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        d = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        d[:] = documents
        d = d.reshape(-1).astype(numpy.int32)
        rs.shuffle(d)
        return d
    first = build_document_index(documents, num_epochs - 1, rs, False)
    last = build_document_index(documents, 1, rs, False)
    return numpy.concatenate((first, last))


def build_shuffle_index(num_samples, total_size, rs):
    dt = numpy.uint32 if total_size < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    first = numpy.arange(0, num_samples, dtype=dt)
    rs.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(num_samples, total_size, dtype=dt)
    rs.shuffle(last)
    return numpy.concatenate((first, last))


def build_sample_idx(sizes, doc_idx, seq, num_epochs, tpe, drop_last, add):
    sizes = sizes.tolist()
    doc_idx = doc_idx.tolist()
    if drop_last:
        n = (num_epochs * tpe - add) // seq
    else:
        n = int(numpy.ceil(numpy.float32(num_epochs * tpe - add) / numpy.float32(seq)))
    out = [(0, 0)]
    di, off = 0, 0
    while len(out) <= n:
        remaining = seq + add
        while remaining != 0:
            dl = sizes[doc_idx[di]] - off
            remaining -= dl
            if remaining <= 0:
                off += remaining + dl - add
                remaining = 0
            else:
                if di == len(doc_idx) - 1:
                    off = sizes[doc_idx[di]] - add
                    break
                di += 1
                off = 0
        out.append((di, off))
    return numpy.array(out, dtype=numpy.int64)


class GPTDatasetRef:
    def __init__(self, low, indices, num_samples, seq, seed=1234, add=1, drop_last=True, pad=-1):
        self.low, self.seq, self.add, self.pad = low, seq, add, pad
        self.tpe = int(numpy.sum(low.sequence_lengths[indices]))
        e, tokens = 1, self.tpe
        if num_samples is not None:
            while tokens < num_samples * seq + add:
                e += 1
                tokens += self.tpe
        self.num_epochs = e
        self.separate = False
        if e > 1:
            sans = ((e - 1) * self.tpe - add) // seq
            per_epoch = (self.tpe - add) // seq
            self.separate = (num_samples - sans) < int(0.80 * per_epoch)
        rs = numpy.random.RandomState(seed)
        self.document_index = build_document_index(indices, e, rs, self.separate)
        self.sample_index = build_sample_idx(low.sequence_lengths, self.document_index, seq, e,
                                             self.tpe, drop_last, add)
        total = self.sample_index.shape[0] - 1
        self.shuffle_index = build_shuffle_index(sans if self.separate else total, total, rs)

    def __len__(self):
        return self.sample_index.shape[0] - 1

    def text(self, idx):
        j = self.shuffle_index[idx]
        b, bo = self.sample_index[j]
        e, eo = self.sample_index[j + 1]
        parts = []
        if b == e:
            parts.append(self.low.get(self.document_index[b], offset=int(bo), length=eo - bo + self.add))
        else:
            for i in range(b, e + 1):
                off = 0 if i > b else bo
                ln = None if i < e else eo + self.add
                parts.append(self.low.get(self.document_index[i], offset=int(off), length=ln))
        n = sum(map(len, parts))
        if n < self.seq + self.add:
            parts.append([self.pad] * (self.seq + self.add - n))
        return numpy.concatenate(parts, dtype=numpy.int64)


def fmt(a):
    return ", ".join(str(int(x)) for x in a)


def describe_sample(ds, idx):
    """One C++ initializer row: {idx, shuffle[idx], sample_index[j] (pos, off), sample_index[j+1]
    (pos, off), sum of the seq+1 tokens, FNV-1a, first 6 tokens, last 6 tokens}."""
    t = ds.text(idx)
    j = int(ds.shuffle_index[idx])
    b, bo = map(int, ds.sample_index[j])
    e, eo = map(int, ds.sample_index[j + 1])
    print(f"  {{{idx}, {j}, {b}, {bo}, {e}, {eo}, {int(t.sum())}, 0x{fnv1a(t):016x}ULL, "
          f"{{{fmt(t[:6])}}}, {{{fmt(t[-6:])}}}}},")


def main(argv=None):
    ap = script_errors.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    script_errors.import_or_rerun(__file__, argv, "numpy")
    print(f"numpy {numpy.__version__}")

    # ---- RNG goldens -------------------------------------------------------------------------------
    print("\n# RNG")
    for seed in (0, 1234, 2**40 + 5):
        ss = numpy.random.SeedSequence(seed)
        print(f"SeedSequence({seed}).generate_state(8, uint32): {{{', '.join(hex(x) for x in ss.generate_state(8, numpy.uint32))}}}")
        raw = numpy.random.default_rng(seed).bit_generator.random_raw(6)
        print(f"default_rng({seed}) random_raw(6): {{{', '.join(f'{int(x)}ULL' for x in raw)}}}")
    print("default_rng(0).integers(1,4096,100000,int32) first 10:",
          fmt(numpy.random.default_rng(0).integers(1, 4096, 100000, dtype=numpy.int32)[:10]))
    L = numpy.random.default_rng(0).integers(1, 4096, 100000, dtype=numpy.int32)
    print("  sum:", int(L.sum(dtype=numpy.int64)), " last 5:", fmt(L[-5:]))
    print("default_rng(1234).integers(-5, 7, 20, int32):",
          fmt(numpy.random.default_rng(1234).integers(-5, 7, 20, dtype=numpy.int32)))
    # Ranges close to 2^32 exercise the rejection loop; the full 32-bit range takes raw draws.
    g = numpy.random.default_rng(3)
    print("default_rng(3).integers(-2**31, 2**31-1, 10, int32):",
          fmt(g.integers(-2**31, 2**31 - 1, 10, dtype=numpy.int32)))
    g = numpy.random.default_rng(3)
    print("default_rng(3).integers(-2**31+1, 2**31-1, 10, int32):",
          fmt(g.integers(-2**31 + 1, 2**31 - 1, 10, dtype=numpy.int32)))
    g = numpy.random.default_rng(5)
    print("default_rng(5).integers(-2**31, 2**31, 6, int32) [full range]:",
          fmt(g.integers(-2**31, 2**31, 6, dtype=numpy.int32)))
    g = numpy.random.default_rng(5)
    print("default_rng(5).integers(9, 10, 3, int32) then random_raw(1) [no draws for a 1-value range]:",
          fmt(g.integers(9, 10, 3, dtype=numpy.int32)), int(g.bit_generator.random_raw()))

    rs = numpy.random.RandomState(1234)
    print("RandomState(1234) raw uint32 first 8:", fmt(rs._bit_generator.random_raw(8)))
    rs = numpy.random.RandomState(1234)
    a = numpy.arange(33333, dtype=numpy.int32)
    rs.shuffle(a)
    print("RandomState(1234).shuffle(arange(33333,int32)) first 20:", fmt(a[:20]))
    print("  last 5:", fmt(a[-5:]), " fnv:", hex(fnv1a(a)))
    b = numpy.arange(16648, dtype=numpy.uint32)
    rs.shuffle(b)
    print("  then shuffle(arange(16648,uint32)) first 20:", fmt(b[:20]), " fnv:", hex(fnv1a(b)))
    c = numpy.arange(10, dtype=numpy.int64)
    rs.shuffle(c)
    print("  then shuffle(arange(10,int64)):", fmt(c))
    rs = numpy.random.RandomState(1234)
    print("RandomState(1234).randint(0, 2**33+1, 6, int64) [= random_interval(2^33), 64-bit draws]:",
          fmt(rs.randint(0, 2**33 + 1, 6, dtype=numpy.int64)))
    rs = numpy.random.RandomState(7)
    print("RandomState(7).randint(0, 0xFFFFFFFF+1, 4, int64) [= random_interval(2^32-1)]:",
          fmt(rs.randint(0, 2**32, 4, dtype=numpy.int64)))
    print("  then randint(0, 2**32+1, 4, int64) [= random_interval(2^32), 64-bit]:",
          fmt(rs.randint(0, 2**32 + 1, 4, dtype=numpy.int64)))

    # ---- splits ------------------------------------------------------------------------------------
    print("\n# splits")
    for s, n in (("1,1,1", 100000), ("9999,8,2", 100000), ("99,1,0", 1000), ("6,3,1", 50),
                 ("0.7, 0.2 ,0.1", 33), ("1,2", 7)):
        print(f"split {s!r} N={n}: {split_ranges(s, n)}")

    # ---- mock dataset ------------------------------------------------------------------------------
    print("\n# mock dataset (vocab 32000, eod 31999)")
    low = MockLowLevel(32000, 31999)
    tr = split_ranges("1,1,1", 100000)[0]
    train_idx = numpy.arange(tr[0], tr[1], dtype=numpy.int32)
    for seq, ns, samples in ((4096, 3200, (0, 1, 2, 3, 63, 64, 1000, 3199, 16647)),
                             (8192, 1600, (0, 1, 1599, 8323)),
                             (4096, 20000, (0, 16647, 16648, 20000, 33295)),
                             (4096, 30648, (0, 16648, 30647, 33295))):
        ds = GPTDatasetRef(low, train_idx, ns, seq)
        print(f"seq {seq} num_samples {ns}: tpe {ds.tpe} epochs {ds.num_epochs} separate {ds.separate} "
              f"len {len(ds)} doc_index.size {len(ds.document_index)}")
        print(f"  document_index first 10 {{{fmt(ds.document_index[:10])}}} fnv 0x{fnv1a(ds.document_index):016x}ULL")
        if ds.num_epochs > 1:
            print(f"  document_index[33333:33343] {{{fmt(ds.document_index[33333:33343])}}}")
        print(f"  sample_index rows 1..4 {ds.sample_index[1:5].tolist()} last {ds.sample_index[-1].tolist()} "
              f"fnv 0x{fnv1a(ds.sample_index.reshape(-1)):016x}ULL")
        print(f"  shuffle_index first 10 {{{fmt(ds.shuffle_index[:10])}}} fnv 0x{fnv1a(ds.shuffle_index):016x}ULL")
        if ds.separate:
            print(f"  shuffle_index[16648:16658] {{{fmt(ds.shuffle_index[16648:16658])}}}")
        for i in samples:
            describe_sample(ds, i)

    print("\n# mock dataset small vocab (vocab 512, eod 511), seq 4096, 64 samples")
    low = MockLowLevel(512, 511)
    ds = GPTDatasetRef(low, train_idx, 64, 4096)
    print(f"  len {len(ds)}")
    for i in (0, 1, 63):
        describe_sample(ds, i)
    t = ds.text(0)
    print("  sample 0: count of 511:", int((t == 511).sum()))

    # ---- generic table dataset ---------------------------------------------------------------------
    print("\n# table dataset: lengths default_rng(7).integers(1, 20, 50, int32), token = 1000*seq + offset")
    lens = numpy.random.default_rng(7).integers(1, 20, 50, dtype=numpy.int32)
    print("  lengths:", fmt(lens))
    low = TableLowLevel(lens)
    rngs = split_ranges("6,3,1", 50)
    print("  ranges:", rngs)
    tr = numpy.arange(*rngs[0], dtype=numpy.int32)
    va = numpy.arange(*rngs[1], dtype=numpy.int32)
    for name, idx, ns, seq, drop_last, seed in (("train 100x8", tr, 100, 8, True, 1234),
                                               ("train 40x8", tr, 40, 8, True, 99),
                                               ("valid one-epoch x16 no-drop", va, None, 16, False, 1234)):
        ds = GPTDatasetRef(low, idx, ns, seq, seed=seed, drop_last=drop_last)
        print(f"  {name}: tpe {ds.tpe} epochs {ds.num_epochs} separate {ds.separate} len {len(ds)}")
        print(f"    document_index {{{fmt(ds.document_index)}}}" if len(ds.document_index) <= 100 else
              f"    document_index first 20 {{{fmt(ds.document_index[:20])}}} fnv 0x{fnv1a(ds.document_index):016x}ULL")
        print(f"    sample_index flat fnv 0x{fnv1a(ds.sample_index.reshape(-1)):016x}ULL last {ds.sample_index[-1].tolist()}")
        print(f"    shuffle_index first 20 {{{fmt(ds.shuffle_index[:20])}}} fnv 0x{fnv1a(ds.shuffle_index):016x}ULL")
        for i in (0, 1, len(ds) - 1):
            print(f"    text[{i}] = {{{fmt(ds.text(i))}}}")


if __name__ == "__main__":
    script_errors.run_main(PROG, main)
