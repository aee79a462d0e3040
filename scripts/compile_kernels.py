#!/usr/bin/env python3
"""Compiles strata's CUDA kernels with NVRTC and assembles them with ptxas, without a GPU.

    python3 scripts/compile_kernels.py --nvrtc LIBNVRTC --ptxas PTXAS --out DIR KERNEL.cu...

The sources are one program, in the order given (strata compiles them as one: ll.cu uses what
reduce.cu defines), named after the first. For each architecture (sm_80, sm_90): NVRTC (the library strata loads at run
time, from the PyPI package nvidia-cuda-nvrtc-cu12) compiles it to PTX with the options strata
uses, and ptxas (from nvidia-cuda-nvcc-cu12) assembles that PTX to SASS, so a kernel that no
longer compiles, or whose PTX no longer assembles, fails CI. Prints each kernel entry found.
"""
import argparse
import ctypes
import pathlib
import re
import subprocess
import sys

ARCHES = ["80", "90"]


def nvrtc_compile(lib, source, name, arch):
    prog = ctypes.c_void_p()
    check = lambda r, what: r == 0 or sys.exit(f"{what} failed: {lib.nvrtcGetErrorString(r).decode()}")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source, name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    opts = [f"--gpu-architecture=compute_{arch}".encode(), b"--std=c++17", b"-default-device"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if r != 0:
        sys.exit(f"{name} for compute_{arch}: NVRTC failed:\n{log.value.decode()}")
    if log.value.strip():
        sys.exit(f"{name} for compute_{arch}: NVRTC warnings are errors here:\n{log.value.decode()}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvrtc", required=True)
    ap.add_argument("--ptxas", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("sources", nargs="+")
    a = ap.parse_args()
    lib = ctypes.CDLL(a.nvrtc)
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    srcs = list(map(pathlib.Path, a.sources))
    src = srcs[0]
    source = b"\n".join(s.read_bytes() for s in srcs)
    for arch in ARCHES:
        ptx = nvrtc_compile(lib, source, src.name, arch)
        entries = re.findall(rb"\.entry\s+(\w+)", ptx)
        ptx_path = out / f"{src.stem}.sm_{arch}.ptx"
        ptx_path.write_bytes(ptx)
        cubin = out / f"{src.stem}.sm_{arch}.cubin"
        subprocess.run([a.ptxas, f"-arch=sm_{arch}", "-o", str(cubin), str(ptx_path)], check=True)
        print(f"{'+'.join(x.name for x in srcs)}: sm_{arch}: {len(entries)} kernels, PTX {len(ptx)} bytes, "
              f"cubin {cubin.stat().st_size} bytes")
        if not entries:
            sys.exit(f"{src.name}: no kernels in the PTX")


if __name__ == "__main__":
    main()
