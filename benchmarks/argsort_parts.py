"""Where the one-device argsort of a selection spends its time, piece by piece (one GPU).

``dask_compact.argsort(x[x < p])`` of 2^28 float32 CuPy chunks took 28.9 ms on one H100
(2026-12-07, 5803cee) where ``cupy.argsort(x[x < p].compute())`` took 21.6 and the sort of
values matched CuPy's (16.1 against 16.5 ms). This times the steps of the chunk-level argsort
(``cupy_sort.sort_chunk`` with ``indices=True``) and the alternatives for each, on one array
of the selection's size, plus the Dask-level calls on the same data, in one process:

    python -P benchmarks/argsort_parts.py --out benchmarks/results

Every variant of the keys is checked bit for bit against the keys as CuPy's elementwise
calls made them (``cupy_sort._keys`` before 6c5f662) on data with
NaNs of both signs, -0.0, subnormals and infinities before it is timed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import file_stem, label, random_array, save, selection_args, timed_ms


def special_data(cupy, n: int):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(n).astype(np.float32)
    specials = np.array([np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45, -1e-45,
                         np.float32(1.17e-38), -np.float32(1e-40)], np.float32)
    a[rng.integers(0, n, n // 50)] = rng.choice(specials, n // 50)
    return cupy.asarray(a)


def run(log2n: int, chunk_log2: int, p: float, reps: int) -> list[dict]:
    import cupy

    import dask_compact
    from dask_compact.backends import cupy_sort

    rows: list[dict] = []

    def row(part: str, ms: float, note: str = "") -> None:
        rows.append(dict(part=part, ms=ms, note=note))
        print(f"{part:60s} {ms:8.3f} ms  {note}", flush=True)

    def sync() -> None:
        cupy.cuda.Device().synchronize()

    # the Dask-level calls first, on the selection as users write it
    x = random_array(2**log2n, 2**chunk_log2, 11, True, f"argsort-parts-{log2n}").persist()
    sel = x[x < p]
    whole = sel.compute()
    k = int(whole.size)
    row("dask_compact.argsort(x[x < p])", timed_ms(lambda: dask_compact.argsort(sel), sync, reps))
    row("dask_compact.sort(x[x < p])", timed_ms(lambda: dask_compact.sort(sel), sync, reps))
    row("x[x < p].compute()", timed_ms(lambda: sel.compute(), sync, reps))
    row("cupy.argsort(x[x < p].compute())",
        timed_ms(lambda: cupy.argsort(sel.compute()), sync, reps))

    # the chunk-level steps on the selection in one array
    a = whole
    empty = np.zeros(0, np.int64)
    row("sort_chunk(a, indices=True) [the step before: with the values]",
        timed_ms(lambda: cupy_sort.sort_chunk(a, True, 0, empty), sync, reps), f"k={k}")
    row("sort_chunk(a, indices=True, values=False) [the step now]",
        timed_ms(lambda: cupy_sort.sort_chunk(a, True, 0, empty, values=False), sync, reps))
    row("cupy.argsort(a) [floor]", timed_ms(lambda: cupy.argsort(a), sync, reps))
    row("cupy.sort(a)", timed_ms(lambda: cupy.sort(a), sync, reps))
    keys = cupy_sort._keys(a)
    row("cupy.argsort(keys)", timed_ms(lambda: cupy.argsort(keys), sync, reps))
    order = cupy.argsort(keys)
    row("keys[order]", timed_ms(lambda: keys[order], sync, reps))
    row("order += 0", timed_ms(lambda: order.__iadd__(0), sync, reps))
    row("a.copy() [copy floor, 4 B/elem]", timed_ms(lambda: a.copy(), sync, reps))
    row("order.copy() [copy, 8 B/elem]", timed_ms(lambda: order.copy(), sync, reps))

    # one-pass keys: bits where the value is not -0.0 or a NaN (NaN by its bits: CuPy's
    # kernels flush subnormals in float comparisons)
    u = np.uint32
    sign, inf, nan = u(0x80000000), u(0x7F800000), np.float32(np.nan).view(u)

    def keys_where(v):
        bits = v.view(u)
        mag = bits & u(0x7FFFFFFF)
        return cupy.where(mag > inf, nan, cupy.where(bits == sign, u(0), bits)).view(v.dtype)

    ew = cupy.ElementwiseKernel(
        "uint32 b", "uint32 k",
        "k = (b & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : (b == 0x80000000u ? 0u : b)",
        "dcx_probe_sort_keys")

    def keys_ew(v):
        return ew(v.view(u)).view(v.dtype)

    def fused_body(b):  # a named function: cupy.fuse names its kernel after it (a lambda
        # made "<lambda>", which NVRTC refused: the run of 0701633)
        return cupy.where((b & u(0x7FFFFFFF)) > inf, nan, cupy.where(b == sign, u(0), b))

    fused = cupy.fuse(fused_body)

    def keys_fused(v):
        return fused(v.view(u)).view(v.dtype)

    def keys_before(v):  # cupy_sort._keys until 6c5f662: CuPy's elementwise calls
        zeroed = cupy_sort.split_radix.folded_bits(v, cupy).view(v.dtype)
        return cupy.where(cupy.isnan(v), v.dtype.type(np.nan), zeroed)

    check = special_data(cupy, 1 << 20)
    want = keys_before(check).view(u)
    for name, fn in (("_keys (kernels/sort_keys.cu)", cupy_sort._keys),
                     ("elementwise calls (_keys before)", keys_before),
                     ("where x2 on bits", keys_where), ("ElementwiseKernel", keys_ew),
                     ("cupy.fuse", keys_fused)):
        try:
            got = fn(check).view(u)
            same = bool((got == want).all())
        except Exception as e:  # a variant that does not build is reported, not fatal
            row(f"keys: {name}", float("nan"), f"FAILED: {type(e).__name__}: {e}"[:200])
            continue
        row(f"keys: {name}", timed_ms(lambda fn=fn: fn(a), sync, reps),
            "bit-identical to the keys before" if same else "DIFFERS from the keys before")
        if same:
            o1 = cupy.argsort(fn(check))
            o0 = cupy.argsort(keys_before(check))
            row(f"keys: {name}: argsort equal", 0.0, str(bool((o1 == o0).all())))

    row("argsort of uint32 order keys (order_key + argsort)",
        timed_ms(lambda: cupy.argsort(cupy_sort.split_radix.order_key(a, cupy)), sync, reps))
    row("argsort(keys_ew(a)) [the step without the gather]",
        timed_ms(lambda: cupy.argsort(keys_ew(a)), sync, reps))
    pieces = [a[i * (k // 8):(i + 1) * (k // 8)] for i in range(8)]
    row("cupy.concatenate(8 pieces)", timed_ms(lambda: cupy.concatenate(pieces), sync, reps))
    return rows


def main() -> None:
    ap = selection_args(__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--sha", default=None)
    args = ap.parse_args()
    rows = run(args.log2n, args.chunk_log2, args.p, args.reps)
    today, device, sha = label(True, args.sha)
    text = [f"# The one-device argsort's parts, {device}, {today}, git {sha}", "",
            f"2^{args.log2n} float32 in chunks of 2^{args.chunk_log2}, x[x < {args.p}]; median "
            f"ms of {args.reps} after a warm-up, device synchronised.", "",
            "| part | ms | note |", "|---|---|---|"]
    text += [f"| {r['part']} | {r['ms']:.3f} | {r['note']} |" for r in rows]
    print("\n".join(text))
    save(args.out, file_stem("argsort-parts", today, device, sha, True), text, rows)

if __name__ == "__main__":
    main()
