#!/usr/bin/env python3
"""What the CUDA driver refuses while a stream records in global capture mode.

For each driver call, on the recording thread, on another thread, and on another thread with
another context current: begin a global-mode capture of a stream (with one memset in it), make
the call, end the capture, and print what the call returned and what the end returned (901: the
call spoiled the recording). Needs only libcuda (ctypes), no toolkit. shim-cuda's
`src/recording.rs` keeps the driver from what this shows refused.

Usage (on a machine with a GPU):  python3 scripts/capture_probe.py
"""
import ctypes as C, threading, sys
cu = C.CDLL("libcuda.so.1")
def ck(name, r):
    if r != 0:
        s = C.c_char_p(); cu.cuGetErrorName(r, C.byref(s)); return f"{r}:{s.value.decode()}"
    return "ok"
def must(name, r):
    if r != 0: raise SystemExit(f"{name} -> {ck(name, r)}")
must("init", cu.cuInit(0))
dev = C.c_int(); must("dev", cu.cuDeviceGet(C.byref(dev), 0))
ctx = C.c_void_p(); must("retain", cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev))
must("cur", cu.cuCtxSetCurrent(ctx))
ctx2 = C.c_void_p()
r = cu.cuCtxCreate_v2(C.byref(ctx2), 0, dev); print("cuCtxCreate", ck("", r))
must("cur", cu.cuCtxSetCurrent(ctx))
class Loc(C.Structure): _fields_=[("type",C.c_int),("id",C.c_int)]
class Flags(C.Structure): _fields_=[("comp",C.c_ubyte),("rdma",C.c_ubyte),("usage",C.c_ushort),("res",C.c_ubyte*4)]
class Prop(C.Structure): _fields_=[("type",C.c_int),("hts",C.c_int),("loc",Loc),("win",C.c_void_p),("flags",Flags)]
class Acc(C.Structure): _fields_=[("loc",Loc),("flags",C.c_int)]
prop = Prop(); prop.type=1; prop.loc.type=1; prop.loc.id=0
gran = C.c_size_t(); must("gran", cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0))
G = gran.value
PTX = b""".version 7.0
.target sm_50
.address_size 64
.visible .entry k() { ret; }
"""
def setup():
    """Things the calls below release, made before the capture."""
    st = {}
    p = C.c_uint64(); must("alloc", cu.cuMemAlloc_v2(C.byref(p), 1 << 20)); st["dptr"] = p
    h = C.c_void_p(); must("hostalloc", cu.cuMemHostAlloc(C.byref(h), 1 << 20, 0)); st["hptr"] = h
    buf = C.create_string_buffer(1 << 20); st["buf"] = buf
    must("reg", cu.cuMemHostRegister_v2(buf, 1 << 20, 0))
    st["buf2"] = C.create_string_buffer(1 << 20)
    m = C.c_void_p(); must("mod", cu.cuModuleLoadData(C.byref(m), C.c_char_p(PTX))); st["mod"] = m
    va = C.c_uint64(); must("reserve", cu.cuMemAddressReserve(C.byref(va), 2 * G, 0, 0, 0)); st["va"] = va
    hd = C.c_uint64(); must("create", cu.cuMemCreate(C.byref(hd), G, C.byref(prop), 0))
    must("map", cu.cuMemMap(va, G, 0, hd, 0)); st["hd"] = hd
    acc = Acc(); acc.loc.type = 1; acc.loc.id = 0; acc.flags = 3
    must("access", cu.cuMemSetAccess(va, G, C.byref(acc), 1)); st["acc"] = acc
    ev = C.c_void_p(); must("ev", cu.cuEventCreate(C.byref(ev), 2)); st["ev"] = ev
    s2 = C.c_void_p(); must("s2", cu.cuStreamCreate(C.byref(s2), 1)); st["s2"] = s2
    return st
CALLS = {
 "cuMemAlloc": lambda st: cu.cuMemAlloc_v2(C.byref(C.c_uint64()), 1 << 20),
 "cuMemFree": lambda st: cu.cuMemFree_v2(st["dptr"]),
 "cuMemFreeAsync(s2)": lambda st: cu.cuMemFreeAsync(st["dptr"], st["s2"]),
 "cuMemHostAlloc": lambda st: cu.cuMemHostAlloc(C.byref(C.c_void_p()), 1 << 20, 0),
 "cuMemFreeHost": lambda st: cu.cuMemFreeHost(st["hptr"]),
 "cuMemHostRegister": lambda st: cu.cuMemHostRegister_v2(st["buf2"], 1 << 20, 0),
 "cuMemHostUnregister": lambda st: cu.cuMemHostUnregister(st["buf"]),
 "cuModuleUnload": lambda st: cu.cuModuleUnload(st["mod"]),
 "cuMemCreate": lambda st: cu.cuMemCreate(C.byref(C.c_uint64()), G, C.byref(prop), 0),
 "cuMemMap(2nd granule)": lambda st: (lambda h: cu.cuMemCreate(C.byref(h), G, C.byref(prop), 0) or cu.cuMemMap(C.c_uint64(st["va"].value + G), G, 0, h, 0))(C.c_uint64()),
 "cuMemUnmap": lambda st: cu.cuMemUnmap(st["va"], G),
 "cuMemRelease": lambda st: cu.cuMemRelease(st["hd"]),
 "cuMemAddressReserve": lambda st: cu.cuMemAddressReserve(C.byref(C.c_uint64()), G, 0, 0, 0),
 "cuEventQuery(idle)": lambda st: cu.cuEventQuery(st["ev"]),
 "cuStreamSynchronize(s2)": lambda st: cu.cuStreamSynchronize(st["s2"]),
 "cuStreamQuery(s2)": lambda st: cu.cuStreamQuery(st["s2"]),
 "cuStreamBeginCapture(s2,global)": lambda st: cu.cuStreamBeginCapture_v2(st["s2"], 0),
 "cuEventRecord(s2)": lambda st: cu.cuEventRecord(st["ev"], st["s2"]),
 "cuEventDestroy": lambda st: cu.cuEventDestroy_v2(st["ev"]),
 "cuEventCreate": lambda st: cu.cuEventCreate(C.byref(C.c_void_p()), 2),
 "cuStreamCreate": lambda st: cu.cuStreamCreate(C.byref(C.c_void_p()), 1),
 "cuStreamDestroy(s2)": lambda st: cu.cuStreamDestroy_v2(st["s2"]),
 "cuModuleLoadData": lambda st: cu.cuModuleLoadData(C.byref(C.c_void_p()), C.c_char_p(PTX)),
 "cuMemcpyHtoDAsync(s2)": lambda st: cu.cuMemcpyHtoDAsync_v2(st["dptr"], st["buf"], 4096, st["s2"]),
 "cuMemGetInfo": lambda st: cu.cuMemGetInfo_v2(C.byref(C.c_size_t()), C.byref(C.c_size_t())),
}
KEEP = []
def case(name, other_thread, other_ctx):
    must("cur", cu.cuCtxSetCurrent(ctx))
    st = setup()
    KEEP.append(st)
    s = C.c_void_p(); must("s", cu.cuStreamCreate(C.byref(s), 1))
    must("begin", cu.cuStreamBeginCapture_v2(s, 0))
    must("memset", cu.cuMemsetD8Async(st["dptr"], 1, 16, s))
    out = {}
    def run():
        cu.cuCtxSetCurrent(ctx2 if other_ctx else ctx)
        out["r"] = CALLS[name](st)
    if other_thread:
        t = threading.Thread(target=run); t.start(); t.join()
    else:
        if other_ctx: cu.cuCtxSetCurrent(ctx2)
        out["r"] = CALLS[name](st)
        cu.cuCtxSetCurrent(ctx)
    cu.cuCtxSetCurrent(ctx)
    g = C.c_void_p(); e = cu.cuStreamEndCapture(s, C.byref(g))
    # a second capture started by the call, if any
    cu.cuStreamEndCapture(st["s2"], C.byref(C.c_void_p()))
    after = cu.cuCtxSynchronize()
    return ck("", out["r"]), ck("", e), ck("", after)
print(f"granule {G}")
print(f"{'call':34} {'where':22} {'call returns':36} {'end capture':36} ctxsync")
for name in CALLS:
    for ot, oc, where in [(False, False, "same thread"), (True, False, "other thread"), (True, True, "other thread+ctx")]:
        if oc and not ctx2.value: continue
        try:
            r, e, a = case(name, ot, oc)
        except SystemExit as x:
            r, e, a = str(x), "-", "-"
        print(f"{name:34} {where:22} {r:36} {e:36} {a}")
        sys.stdout.flush()
