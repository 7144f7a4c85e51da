"""What this CPU can run, decided once per process (torch-free).

CpuCaps = the instruction-set features the CPU reports at run time (Linux /proc/cpuinfo flags,
macOS sysctl), minus the ones hidden by the capability mask, plus whether a C compiler is usable.
The C kernels are compiled for exactly that feature set (`kernel_cflags`), never `-march=native`:
a library built under a mask must not contain an instruction the mask hid, and the library's
cache key includes the flags and the features, so a home directory shared between machines never
loads a library built for another CPU.

The mask (`RADIXLANG_CPU_MASK`, a comma list) lets one machine run every fallback:
  avx512_bf16  hide the AVX-512 BF16 dot products (VDPBF16PS) and AMX
  avx512       hide AVX-512 altogether (implies avx512_bf16)
  avx2         hide AVX2 / FMA (implies avx512): plain x86-64 code
  cc           pretend there is no C compiler: torch ops only
Masking avx512_bf16 or wider also caps oneDNN (`ONEDNN_MAX_CPU_ISA`, read by torch's oneDNN at its
first use: `apply_mask_to_environment` must run before the first GEMM), so torch's own bf16 GEMMs
take the path they take on such a CPU too.

Invariant: `isa` is the best of avx512_bf16 > avx512 > avx2 > scalar that both the CPU reports and
the mask allows; every kernel entry point compiled for `isa` runs on this CPU.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal, Optional

MASK_ENV = "RADIXLANG_CPU_MASK"
Isa = Literal["avx512_bf16", "avx512", "avx2", "scalar"]
MASK_WORDS = ("avx512_bf16", "avx512_vnni", "avx512", "avx2", "cc")

# what the AVX-512 kernels need (x86-64-v4 plus nothing else); BF16 adds avx512_bf16
_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
_AVX2 = {"avx2", "fma", "f16c"}


@dataclass(frozen=True)
class CpuCaps:
    arch: str  # platform.machine(): x86_64, aarch64, arm64, ...
    features: frozenset[str]  # reported by the CPU, minus what the mask hides
    masked: frozenset[str]  # the mask's words in effect
    compiler: Optional[str]  # path of the C compiler, None when absent or masked

    @property
    def isa(self) -> Isa:
        f = self.features
        if _AVX512 <= f:
            return "avx512_bf16" if "avx512_bf16" in f else "avx512"
        if _AVX2 <= f:
            return "avx2"
        return "scalar"

    @property
    def native_bf16(self) -> bool:
        """bf16 dot products in hardware (AVX512-BF16 or AMX): bf16 GEMMs run near fp32's rate or better."""
        return "avx512_bf16" in self.features or "amx_bf16" in self.features

    def kernel_cflags(self) -> list[str]:
        """Target flags for the C kernels: exactly the features of `isa`, never the build machine's."""
        if self.arch not in ("x86_64", "AMD64"):
            return []  # portable C; the compiler's default target for this architecture
        # every CPU with AVX512-BF16 has AVX512-VNNI (Cooper Lake, Sapphire Rapids, Zen 4 / 5), and many without
        # BF16 have it (Cascade Lake, Ice Lake: the int8 kernels' VPDPBUSD); the flag is only given where the CPU
        # reports it (the avx512_vnni mask word hides it: Skylake's AVX512BW paths)
        vnni = ["-mavx512vnni"] if "avx512_vnni" in self.features else []
        return {"avx512_bf16": ["-march=x86-64-v4", "-mavx512bf16", *vnni], "avx512": ["-march=x86-64-v4", *vnni],
                "avx2": ["-march=x86-64-v3"], "scalar": ["-march=x86-64"]}[self.isa]

    def summary(self) -> dict:
        return {"arch": self.arch, "isa": self.isa, "native_bf16": self.native_bf16,
                "compiler": self.compiler is not None, "mask": sorted(self.masked)}


def parse_mask(value: Optional[str]) -> frozenset[str]:
    """'avx512' -> {avx512, avx512_bf16, avx512_vnni}; an unknown word raises ValueError naming it."""
    words = {w.strip().lower() for w in (value or "").split(",") if w.strip()}
    unknown = sorted(words - set(MASK_WORDS))
    if unknown:
        raise ValueError(f"{MASK_ENV}: unknown word(s) {unknown}; known: {', '.join(MASK_WORDS)}")
    if "avx2" in words:
        words.add("avx512")
    if "avx512" in words:
        words.update(("avx512_bf16", "avx512_vnni"))
    return frozenset(words)


def _reported_features() -> frozenset[str]:
    system = platform.system()
    if system == "Linux":
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    key = line.split(":", 1)[0].strip()
                    if key in ("flags", "Features"):  # x86 / ARM
                        return frozenset(line.split(":", 1)[1].split())
        except OSError:
            pass
        return frozenset()
    if system == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return frozenset()
        feats = set()
        for line in out.splitlines():
            if line.startswith(("machdep.cpu.features", "machdep.cpu.leaf7_features")):
                feats.update(w.lower().replace(".", "_") for w in line.split(":", 1)[1].split())
            elif line.startswith("hw.optional.") and line.rstrip().endswith(": 1"):
                feats.add(line.split(":")[0][len("hw.optional."):])
        return frozenset(feats)
    return frozenset()


def apply_mask(features: frozenset[str], masked: frozenset[str]) -> frozenset[str]:
    drop = set()
    for f in features:
        if "avx512_bf16" in masked and (f == "avx512_bf16" or f.startswith("amx")):
            drop.add(f)
        if "avx512_vnni" in masked and f == "avx512_vnni":
            drop.add(f)
        if "avx512" in masked and (f.startswith("avx512") or f.startswith("amx")):
            drop.add(f)
        if "avx2" in masked and f in _AVX2 | {"avx_vnni"}:
            drop.add(f)
    return frozenset(features - drop)


@functools.lru_cache(maxsize=1)
def detect() -> CpuCaps:
    """This process's capabilities (the mask is read once, here)."""
    masked = parse_mask(os.environ.get(MASK_ENV))
    cc = None
    if "cc" not in masked:
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return CpuCaps(platform.machine(), apply_mask(_reported_features(), masked), masked, cc)


def apply_mask_to_environment() -> None:
    """Cap oneDNN at what the mask leaves (before torch's first GEMM). No-op without a mask."""
    caps = detect()
    if "ONEDNN_MAX_CPU_ISA" in os.environ or not caps.masked & {"avx512_bf16", "avx512_vnni", "avx512", "avx2"}:
        return
    avx512 = "AVX512_CORE_VNNI" if "avx512_vnni" in caps.features else "AVX512_CORE"
    os.environ["ONEDNN_MAX_CPU_ISA"] = {"avx512": avx512, "avx2": "AVX2", "scalar": "SSE41"}.get(caps.isa, avx512)
