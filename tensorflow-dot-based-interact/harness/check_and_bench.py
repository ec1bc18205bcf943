#!/usr/bin/env python3
"""Standalone GPU correctness check and bandwidth benchmark for the dot-interaction
kernels. Needs CuPy, numpy and the harness library (make harness); no TensorFlow.

The library is the very same csrc/dot_based_interact_kernels.cu that the TF op links,
loaded through its extern "C" launchers with ctypes; CuPy owns the device memory.

  python3 check_and_bench.py [--lib PATH] [--quick] [--no-check] [--no-bench] [--json F]
"""
import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np
import cupy as cp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference as ref  # noqa: E402

PATH_IDS = {"auto": 0, "generic": 1, "tensor": 2, "fallback": 3}
PATH_NAMES = {v: k for k, v in PATH_IDS.items()}
DTYPE_IDS = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
GUARD = 64  # poisoned elements on each side of every output buffer

# relative-error thresholds per (dtype, path)
def threshold(dtype, path):
    if np.dtype(dtype) == np.float16:
        return 1e-2
    # tensor path in fp32 = TF32: 10-bit mantissa, unit roundoff 2^-11 per rounded input,
    # so a single product can be off by ~1e-3; measured norm errors are 2e-4..8e-4
    return 2e-3 if path == "tensor" else 1e-5


def load_lib(path):
    lib = ctypes.CDLL(path)
    c_int, c_ll, vp = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
    lib.dbi_output_width.argtypes = [c_int, c_int]
    lib.dbi_output_width.restype = c_int
    lib.dbi_forward_path.argtypes = [c_int, vp, vp, vp, c_ll, c_int, c_int, c_int, c_int]
    lib.dbi_forward_path.restype = c_int
    lib.dbi_backward_path.argtypes = [c_int, vp, vp, vp, vp, c_ll, c_int, c_int, c_int, c_int]
    lib.dbi_backward_path.restype = c_int
    lib.dbi_forward.argtypes = [c_int, vp, vp, vp, c_ll, c_int, c_int, c_int, c_int, vp,
                                ctypes.POINTER(c_int)]
    lib.dbi_forward.restype = c_int
    lib.dbi_backward.argtypes = [c_int, vp, vp, vp, vp, c_ll, c_int, c_int, c_int, c_int, vp,
                                 ctypes.POINTER(c_int)]
    lib.dbi_backward.restype = c_int
    lib.dbi_tensor_config.argtypes = [c_int, c_int, c_int, c_int, ctypes.POINTER(c_int),
                                      ctypes.POINTER(c_int), ctypes.POINTER(c_int)]
    lib.dbi_tensor_config.restype = c_int
    lib.dbi_error_string.argtypes = [c_int]
    lib.dbi_error_string.restype = ctypes.c_char_p
    return lib


class Kernels:
    def __init__(self, lib):
        self.lib = lib

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: rc={rc} {self.lib.dbi_error_string(rc).decode()}")

    def fwd_path(self, x, path, out=None):
        B, R, C = x.shape
        return self.lib.dbi_forward_path(DTYPE_IDS[x.dtype], x.data.ptr, None,
                                         out.data.ptr if out is not None else None,
                                         B, R, C, PATH_IDS[path], 1)

    def bwd_path(self, x, path):
        B, R, C = x.shape
        return self.lib.dbi_backward_path(DTYPE_IDS[x.dtype], x.data.ptr, None, None, None,
                                          B, R, C, PATH_IDS[path], 1)

    def forward(self, x, bottom, out, path):
        B, R, C = x.shape
        used = ctypes.c_int(-99)
        rc = self.lib.dbi_forward(DTYPE_IDS[x.dtype], x.data.ptr, bottom.data.ptr, out.data.ptr,
                                  B, R, C, PATH_IDS[path], 1,
                                  cp.cuda.get_current_stream().ptr, ctypes.byref(used))
        self._check(rc, f"dbi_forward({path}, B={B}, R={R}, C={C}, {x.dtype})")
        return PATH_NAMES.get(used.value, str(used.value))

    def backward(self, x, grad, gx, gb, path):
        B, R, C = x.shape
        used = ctypes.c_int(-99)
        rc = self.lib.dbi_backward(DTYPE_IDS[x.dtype], x.data.ptr, grad.data.ptr, gx.data.ptr,
                                   gb.data.ptr, B, R, C, PATH_IDS[path], 1,
                                   cp.cuda.get_current_stream().ptr, ctypes.byref(used))
        self._check(rc, f"dbi_backward({path}, B={B}, R={R}, C={C}, {x.dtype})")
        return PATH_NAMES.get(used.value, str(used.value))


def guarded(shape, dtype):
    """A NaN-poisoned buffer with GUARD poisoned elements on both sides; returns (flat, view)."""
    n = int(np.prod(shape))
    flat = cp.full(n + 2 * GUARD, np.nan, dtype=dtype)
    return flat, flat[GUARD:GUARD + n].reshape(shape)


def guards_intact(flat):
    g = cp.concatenate([flat[:GUARD], flat[-GUARD:]])
    return bool(cp.all(cp.isnan(g)))


def rand(rng, shape, dtype):
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype)


# ---------------------------------------------------------------------------
# correctness
# ---------------------------------------------------------------------------
def shape_grid(quick):
    if quick:
        return [(7, 27, 128), (333, 27, 128), (5, 2, 3), (7, 33, 129), (3, 64, 256), (1, 1, 5),
                (9, 17, 24)]
    Rs = [1, 2, 3, 5, 8, 15, 16, 17, 27, 31, 32, 33, 47, 64]
    Cs = [1, 3, 4, 8, 16, 24, 100, 127, 128, 129, 256]
    Bs = [1, 7, 333, 1000]
    cases = []
    n = 0
    for R in Rs:
        for C in Cs:
            cases.append((Bs[n % len(Bs)], R, C))
            n += 1
    for B in Bs:
        cases += [(B, 27, 128), (B, 32, 128), (B, 27, 16)]
    cases += [(1000, 64, 256), (1000, 33, 129), (1000, 64, 128)]
    return sorted(set(cases), key=lambda t: (t[1], t[2], t[0]))


def check(kern, quick, rng, log):
    rows = []
    failures = []
    for (B, R, C) in shape_grid(quick):
        W = ref.output_width(R, C)
        for dtype in (np.float32, np.float16):
            x = rand(rng, (B, R, C), dtype)
            bottom = rand(rng, (B, C), dtype)  # independent of x[:, 0]: proves it is read
            grad = rand(rng, (B, W), dtype)    # padding columns hold junk: must be ignored
            xd, bd, gd = cp.asarray(x), cp.asarray(bottom), cp.asarray(grad)
            rf = ref.forward(x, bottom)
            rgx, rgb = ref.backward(x, grad)
            for path in ("auto", "tensor", "generic", "fallback"):
                rec = dict(B=B, R=R, C=C, dtype=np.dtype(dtype).name, path=path)
                # forward
                fp = kern.fwd_path(xd, path)
                if fp < 0:
                    rec["fwd"] = "n/a"
                else:
                    flat, out = guarded((B, W), dtype)
                    used = kern.forward(xd, bd, out, path)
                    cp.cuda.get_current_stream().synchronize()
                    o = cp.asnumpy(out)
                    flat2, out2 = guarded((B, W), dtype)
                    kern.forward(xd, bd, out2, path)
                    e = ref.rel_err(o, rf)
                    ok = (e < threshold(dtype, used) and guards_intact(flat)
                          and guards_intact(flat2)
                          and np.array_equal(o[:, :C], bottom)
                          and not np.any(o[:, C + R * (R - 1) // 2:])
                          and np.array_equal(o, cp.asnumpy(out2), equal_nan=True))
                    rec.update(fwd_used=used, fwd_err=e, fwd_ok=bool(ok))
                    if not ok:
                        failures.append(dict(rec, what="fwd"))
                # backward
                bp = kern.bwd_path(xd, path)
                if bp < 0:
                    rec["bwd"] = "n/a"
                else:
                    fgx, gx = guarded((B, R, C), dtype)
                    fgb, gb = guarded((B, C), dtype)
                    used = kern.backward(xd, gd, gx, gb, path)
                    cp.cuda.get_current_stream().synchronize()
                    gxh, gbh = cp.asnumpy(gx), cp.asnumpy(gb)
                    fgx2, gx2 = guarded((B, R, C), dtype)
                    fgb2, gb2 = guarded((B, C), dtype)
                    kern.backward(xd, gd, gx2, gb2, path)
                    e = ref.rel_err(gxh, rgx)
                    ok = (e < threshold(dtype, used) and guards_intact(fgx)
                          and guards_intact(fgb) and guards_intact(fgx2)
                          and np.array_equal(gbh, grad[:, :C])
                          and np.array_equal(gxh, cp.asnumpy(gx2), equal_nan=True))
                    rec.update(bwd_used=used, bwd_err=e, bwd_ok=bool(ok))
                    if not ok:
                        failures.append(dict(rec, what="bwd"))
                rows.append(rec)
        log.write(f"checked B={B} R={R} C={C}\n")
    return rows, failures


def summarize_check(rows):
    """max error and case count per (dtype, path actually used, direction)."""
    agg = {}
    for r in rows:
        for d in ("fwd", "bwd"):
            if f"{d}_err" not in r:
                continue
            key = (r["dtype"], r[f"{d}_used"], d)
            a = agg.setdefault(key, dict(n=0, max_err=0.0, fails=0))
            a["n"] += 1
            a["max_err"] = max(a["max_err"], r[f"{d}_err"])
            a["fails"] += 0 if r[f"{d}_ok"] else 1
    return agg


# ---------------------------------------------------------------------------
# bandwidth
# ---------------------------------------------------------------------------
NOMINAL_TBPS = [  # (substring of the device name, nominal HBM TB/s)
    ("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35), ("GH200", 4.0),
    ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935), ("A100", 1.555),
    ("L40S", 0.864), ("L4", 0.3), ("A10", 0.6), ("V100", 0.9), ("T4", 0.32),
    ("B200", 8.0),
]


def nominal_bw(name):
    for key, tb in NOMINAL_TBPS:
        if key in name:
            return tb * 1e12
    return None


def time_events(fn, reps, warmup):
    for i in range(warmup):
        fn(i)
    s = cp.cuda.get_current_stream()
    starts = [cp.cuda.Event() for _ in range(reps)]
    stops = [cp.cuda.Event() for _ in range(reps)]
    for i in range(reps):
        starts[i].record(s)
        fn(i)
        stops[i].record(s)
    s.synchronize()
    ts = np.array([cp.cuda.get_elapsed_time(a, b) for a, b in zip(starts, stops)]) * 1e-3
    return float(np.median(ts)), float(ts.min()), float(ts.max())


def bench(kern, rng, reps, warmup, paths=("auto", "generic"), context=True):
    res = []
    # device-to-device copy ceiling
    nbytes = 1 << 30
    a = cp.asarray(rng.integers(0, 255, size=nbytes, dtype=np.uint8))
    b = cp.empty_like(a)
    s = cp.cuda.get_current_stream()

    def memcpy(_):
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, nbytes,
                                    cp.cuda.runtime.memcpyDeviceToDevice, s.ptr)
    med, lo, hi = time_events(memcpy, reps if context else 3, warmup if context else 1)
    copy_bw = 2 * nbytes / med
    res.append(dict(name="d2d memcpy 1 GiB", bytes=2 * nbytes, t_med=med, t_min=lo, t_max=hi,
                    gbps=copy_bw / 1e9))
    del a, b

    B, R, C = 65536, 27, 128
    W = ref.output_width(R, C)
    nbuf = 3
    for dtype in (np.float16, np.float32):
        es = np.dtype(dtype).itemsize
        xs = [cp.random.standard_normal((B, R, C), dtype=np.float32).astype(dtype)
              for _ in range(nbuf)]
        bs = [cp.random.standard_normal((B, C), dtype=np.float32).astype(dtype)
              for _ in range(nbuf)]
        gs = [cp.random.standard_normal((B, W), dtype=np.float32).astype(dtype)
              for _ in range(nbuf)]
        out = cp.empty((B, W), dtype)
        gx = cp.empty((B, R, C), dtype)
        gb = cp.empty((B, C), dtype)
        fwd_bytes = (B * R * C + B * C + B * W) * es
        bwd_bytes = (B * R * C + B * W + B * R * C + B * C) * es
        for path in paths:
            used = kern.forward(xs[0], bs[0], out, path)
            med, lo, hi = time_events(
                lambda i: kern.forward(xs[i % nbuf], bs[i % nbuf], out, path), reps, warmup)
            res.append(dict(name=f"fwd {np.dtype(dtype).name} {used}", bytes=fwd_bytes, t_med=med,
                            t_min=lo, t_max=hi, gbps=fwd_bytes / med / 1e9))
            used = kern.backward(xs[0], gs[0], gx, gb, path)
            med, lo, hi = time_events(
                lambda i: kern.backward(xs[i % nbuf], gs[i % nbuf], gx, gb, path), reps, warmup)
            res.append(dict(name=f"bwd {np.dtype(dtype).name} {used}", bytes=bwd_bytes, t_med=med,
                            t_min=lo, t_max=hi, gbps=bwd_bytes / med / 1e9))
        if not context:
            continue
        # context: what an unfused framework-style forward costs (batched GEMM + gather + concat)
        rows, cols = ref.lower_pairs(R)
        flat_idx = cp.asarray(rows * R + cols)

        def unfused(i):
            xx = xs[i % nbuf]
            z = cp.matmul(xx, xx.transpose(0, 2, 1)).reshape(B, R * R)
            cp.concatenate([bs[i % nbuf], cp.take(z, flat_idx, axis=1),
                            cp.zeros((B, W - C - len(rows)), dtype)], axis=1)
        med, lo, hi = time_events(unfused, max(5, reps // 4), 2)
        res.append(dict(name=f"fwd {np.dtype(dtype).name} cupy-unfused", bytes=fwd_bytes,
                        t_med=med, t_min=lo, t_max=hi, gbps=fwd_bytes / med / 1e9))
        del xs, bs, gs, out, gx, gb
        cp.get_default_memory_pool().free_all_blocks()
    return res, copy_bw


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(HERE, "build", "libdbi_harness.so"))
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None, help="write all results here")
    ap.add_argument("--profile", action="store_true",
                    help="bench the auto path only, no context runs (for ncu)")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()

    seed = args.seed if args.seed is not None else int(time.time()) & 0xFFFFFFFF
    rng = np.random.default_rng(seed)
    cp.random.seed(seed)
    kern = Kernels(load_lib(args.lib))
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    info = dict(device=name, cc=f"{props['major']}.{props['minor']}",
                sms=props.get("multiProcessorCount"), l2_mb=props.get("l2CacheSize", 0) / 2**20,
                smem_optin_kb=props.get("sharedMemPerBlockOptin", 0) / 1024,
                driver=cp.cuda.runtime.driverGetVersion(),
                runtime=cp.cuda.runtime.runtimeGetVersion(), seed=seed)
    print("device:", json.dumps(info), flush=True)
    result = dict(info=info)
    status = 0

    if not args.no_check:
        t0 = time.time()
        rows, failures = check(kern, args.quick, rng, sys.stderr if os.environ.get("DBI_VERBOSE")
                               else open(os.devnull, "w"))
        result["check_rows"] = rows
        result["check_failures"] = failures
        agg = summarize_check(rows)
        print(f"\ncorrectness ({len(rows)} case x path records, {time.time() - t0:.0f} s, "
              f"seed {seed}):")
        print(f"  {'dtype':8s} {'path':9s} {'dir':4s} {'cases':>6s} {'max rel err':>12s} "
              f"{'limit':>8s} fails")
        for (dt, p, d), a in sorted(agg.items()):
            print(f"  {dt:8s} {p:9s} {d:4s} {a['n']:6d} {a['max_err']:12.3e} "
                  f"{threshold(dt, p):8.0e} {a['fails']}")
        result["check_summary"] = {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in agg.items()}
        if failures:
            status = 1
            print(f"\nFAILED: {len(failures)} checks; first few:")
            for f in failures[:10]:
                print("  ", f)
        else:
            print("  all checks passed (NaN-poisoned outputs fully written, guards intact, "
                  "bottom copied exactly, padding zero, deterministic)")

    if not args.no_bench:
        if args.profile:
            res, copy_bw = bench(kern, rng, args.reps, args.warmup, ("auto",), False)
        else:
            res, copy_bw = bench(kern, rng, args.reps, args.warmup)
        nom = nominal_bw(name)
        result["bench"] = res
        result["copy_bw"] = copy_bw
        result["nominal_bw"] = nom
        print(f"\nbandwidth, B=65536 R=27 C=128 on {name} (median of {args.reps} after "
              f"{args.warmup} warm-up, 3 rotating input sets):")
        print(f"  {'kernel':28s} {'MB moved':>9s} {'median us':>10s} {'GB/s':>8s} "
              f"{'% copy':>7s} {'% nominal':>9s}")
        for r in res:
            pn = f"{100 * r['gbps'] * 1e9 / nom:8.1f}%" if nom else "      n/a"
            print(f"  {r['name']:28s} {r['bytes'] / 1e6:9.1f} {r['t_med'] * 1e6:10.1f} "
                  f"{r['gbps']:8.0f} {100 * r['gbps'] * 1e9 / copy_bw:6.1f}% {pn}")
        print(f"  (copy ceiling {copy_bw / 1e9:.0f} GB/s counting read+write; nominal "
              f"{nom / 1e9 if nom else float('nan'):.0f} GB/s)")
        cfgs = []
        for dt in (np.float16, np.float32):
            for bwd in (0, 1):
                w, nb, sm = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
                rc = kern.lib.dbi_tensor_config(DTYPE_IDS[np.dtype(dt)], bwd, 27, 128,
                                                ctypes.byref(w), ctypes.byref(nb), ctypes.byref(sm))
                cfgs.append(f"{np.dtype(dt).name} {'bwd' if bwd else 'fwd'}: " + (
                    f"{w.value} warps/block x {nb.value} blocks/SM, {sm.value / 1024:.1f} KiB/warp"
                    if rc == 0 else f"rc={rc}"))
        result["tensor_config"] = cfgs
        print("  tensor path config: " + "; ".join(cfgs))

    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=float)
    return status


if __name__ == "__main__":
    sys.exit(main())
