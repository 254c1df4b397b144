"""Inner loops of the AArch64 kernels, read from the disassembly (no AArch64 machine needed).

    python benchmarks/aarch64_disasm.py            # builds kernels/aarch64/a64_gemm.c, prints, writes results

Builds the library with the documented command (``pdlkit build-kernels``: cross with
aarch64-linux-gnu-gcc on x86), disassembles it with ``aarch64-linux-gnu-objdump -d`` (plain
``objdump`` on an AArch64 host), and for each micro-kernel finds its hottest loop (the
backward branch whose body holds the most matrix / dot instructions). Per loop iteration it
counts the SMMLA / USMMLA / BFMMLA / SDOT instructions, the bytes loaded (every load, vector
and scalar, by its register width) and the instructions, and derives MACs per loaded byte.
Then the Neoverse N2 peak for the loop's instruction mix (see ``N2`` below for the
per-instruction throughputs assumed) and the bert-mini 8 x 64 GEMM time at that peak.
Writes ``results/aarch64_disasm.md``.
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # benchmarks/machine.py, also when imported

from machine import host_header  # noqa: E402  benchmarks/machine.py
from measure import write_report  # noqa: E402  benchmarks/measure.py

# MACs one instruction does (128-bit vectors): SMMLA/USMMLA 2x8 . 8x2 int8; BFMMLA 2x4 . 4x2
# bf16; SDOT 4 lanes x 4 int8; FMLA 4 fp32 lanes.
MACS = {"smmla": 32, "usmmla": 32, "ummla": 32, "bfmmla": 16, "sdot": 16, "udot": 16, "fmla": 4}

# Neoverse N2 (Yitian 710 cores): two 128-bit vector pipes (V0, V1). Issue rates per cycle
# assumed from Arm's Neoverse N2 Software Optimization Guide: integer matrix multiply
# (SMMLA/USMMLA) and dot product (SDOT) on both pipes, BFMMLA one per cycle, FMLA on both.
# The bert-mini estimate below is only as good as these; benchmarks/aarch64_bert.py measures.
N2 = {
    "smmla": 2.0,
    "usmmla": 2.0,
    "ummla": 2.0,
    "sdot": 2.0,
    "udot": 2.0,
    "bfmmla": 1.0,
    "fmla": 2.0,
}
N2_GHZ = 2.75  # Yitian 710 all-core clock (the published maximum is 3.2 GHz)
N2_WIDTH = 5  # instructions decoded per cycle

# the micro-kernel symbols of a64_gemm.c and what each computes
KERNELS = {
    "tile_smmla": "int8 s8 x s8, SMMLA (i8mm)",
    "tile_usmmla": "int8 u8 x s8, USMMLA (i8mm)",
    "tile_sdot": "int8, SDOT fallback (asimddp)",
    "tile_bfmmla": "bf16, BFMMLA (bf16)",
}

# bert-mini, batch 8 x 64 = 512 rows: per layer Q, K, V, attention out (256 -> 256), FFN
# up (256 -> 1024) and down (1024 -> 256); 4 layers.
ROWS, HIDDEN, FFN, LAYERS = 512, 256, 1024, 4
BERT_MINI_MACS = LAYERS * ROWS * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN)

_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
_FUNC = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")
_BRANCH = re.compile(r"^(b\.\w+|b|cbn?z|tbn?z)$")


@dataclass
class Loop:
    start: int
    end: int
    insns: list[tuple[str, str]]

    def count(self, names: tuple[str, ...]) -> int:
        return sum(1 for m, _ in self.insns if m in names)

    @property
    def mma(self) -> dict[str, int]:
        return {m: n for m in MACS if m != "fmla" and (n := self.count((m,)))}

    @property
    def macs(self) -> int:
        return sum(MACS[m] * n for m, n in self.mma.items())

    @property
    def loaded(self) -> int:
        return sum(_load_bytes(m, ops) for m, ops in self.insns)


def _reg_bytes(reg: str) -> int:
    reg = reg.strip().strip("{}").strip()
    if reg[:1] in "qQ":
        return 16
    if reg[:1] in "dDxX":
        return 8
    if reg[:1] in "sSwW":
        return 4
    if reg[:1] in "hH":
        return 2
    if reg[:1] in "bB":
        return 1
    return 0


def _load_bytes(mnemonic: str, ops: str) -> int:
    """Bytes one load instruction reads (0 for anything else)."""
    regs = ops.split("[", 1)[0]
    if mnemonic in ("ldr", "ldur", "ldrsw", "ldrb", "ldrh", "ldrsb", "ldrsh"):
        return {"ldrb": 1, "ldrsb": 1, "ldrh": 2, "ldrsh": 2, "ldrsw": 4}.get(
            mnemonic, _reg_bytes(regs.split(",")[0])
        )
    if mnemonic in ("ldp", "ldnp"):
        return 2 * _reg_bytes(regs.split(",")[0])
    if mnemonic.startswith(("ld1", "ld2", "ld3", "ld4")):
        lists = re.findall(r"v\d+\.(\d*)([bhsd])", regs)
        if "}[" in ops or mnemonic.endswith("r"):  # one lane, or load-and-replicate
            return len(lists) * {"b": 1, "h": 2, "s": 4, "d": 8}[lists[0][1]] if lists else 0
        return sum((int(n) if n else 1) * {"b": 1, "h": 2, "s": 4, "d": 8}[t] for n, t in lists)
    return 0


def disassemble(lib: Path) -> dict[str, list[tuple[int, str, str]]]:
    objdump = (
        "objdump" if platform.machine() in ("aarch64", "arm64") else "aarch64-linux-gnu-objdump"
    )
    if shutil.which(objdump) is None:
        raise SystemExit(f"needs {objdump} (apt-get install binutils-aarch64-linux-gnu)")
    text = subprocess.check_output([objdump, "-d", "--no-show-raw-insn", str(lib)], text=True)
    funcs: dict[str, list[tuple[int, str, str]]] = {}
    current: list[tuple[int, str, str]] | None = None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            current = funcs.setdefault(m.group(1), [])
            continue
        m = _LINE.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2), m.group(3).split("//")[0].strip()))
    return funcs


def hottest_loop(code: list[tuple[int, str, str]]) -> Loop | None:
    """The innermost loop (a backward branch with no other loop inside its body) in ``code``
    with the most matrix / dot instructions: the micro-kernel's K loop."""
    back: list[tuple[int, int]] = []  # (start, branch address)
    for addr, mnemonic, ops in code:
        target = re.search(r"\b([0-9a-f]+) <", ops) if _BRANCH.match(mnemonic) else None
        if target and int(target.group(1), 16) < addr:
            back.append((int(target.group(1), 16), addr))
    best: Loop | None = None
    for start, end in back:
        if any(start <= s and e < end for s, e in back if (s, e) != (start, end)):
            continue  # an outer loop
        loop = Loop(start, end, [(m, o) for a, m, o in code if start <= a <= end])
        if best is None or (loop.macs, -len(loop.insns)) > (best.macs, -len(best.insns)):
            best = loop
    return best if best is not None and best.macs else None


def report(lib: Path) -> str:
    funcs = disassemble(lib)
    rows, notes = [], []
    for name, what in KERNELS.items():
        code = funcs.get(name)
        loop = hottest_loop(code) if code else None
        if loop is None:
            notes.append(f"- `{name}`: no loop with matrix instructions found")
            continue
        mix = ", ".join(f"{n} {m.upper()}" for m, n in loop.mma.items())
        pipes = max(n / N2[m] for m, n in loop.mma.items())  # the matrix pipes' bound
        issue = len(loop.insns) / N2_WIDTH  # the front end's bound
        rows.append(
            f"| `{name}` | {what} | {len(loop.insns)} | {mix} | {loop.loaded} | "
            f"{sum(loop.mma.values()) / loop.loaded:.3f} | {loop.macs / loop.loaded:.1f} | "
            f"{pipes:g} / {issue:.1f} | {loop.macs / max(pipes, issue):.0f} |"
        )
    int8_peak = MACS["smmla"] * N2["smmla"]
    fp32_peak = MACS["fmla"] * N2["fmla"]
    bf16_peak = MACS["bfmmla"] * N2["bfmmla"]
    ms = lambda macs_per_cycle: BERT_MINI_MACS / macs_per_cycle / (N2_GHZ * 1e6)  # noqa: E731
    out = [
        "# AArch64 kernel inner loops (from the disassembly)",
        "",
        *host_header(),  # CPU model, AMX, GPU name, versions, commit
        "",
        f"Library: `{lib.name}`, built by `pdlkit build-kernels` "
        "(`-O3 -march=armv8-a -mtune=neoverse-n2`, per-function i8mm / bf16 / dotprod targets). "
        "One row per micro-kernel: its hottest loop, one iteration = one K step of an 8 x 8 tile.",
        "",
        "| micro-kernel | computes | instructions | matrix / dot instructions | bytes loaded "
        "| matrix instr. per loaded byte | MACs per loaded byte "
        "| N2 cycles: pipes / issue | N2 loop peak MACs/cycle |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        *notes,
        "",
        f"Neoverse N2 issue rates assumed (per cycle): {', '.join(f'{k.upper()} {v:g}' for k, v in N2.items())}; "
        f"{N2_WIDTH}-wide decode; {N2_GHZ} GHz. A loop's peak is its MACs over the larger of the two "
        "cycle bounds (matrix pipes, instruction issue); loads are not modelled (L1 serves "
        "the 128 bytes of an iteration in under the 8 cycles of its 16 SMMLA).",
        "",
        f"bert-mini 8 x 64 GEMMs: {BERT_MINI_MACS / 1e9:.3f} G MACs "
        f"({LAYERS} layers x 512 rows x (4 x 256 x 256 + 2 x 256 x 1024)); attention's two "
        "batched matmuls (67 M MACs, fp32) are not in this count.",
        "",
        "| path | peak MACs/cycle (one core) | GEMM time at peak |",
        "|---|---|---|",
        f"| FP32 FMLA (NEON) | {fp32_peak:g} | {ms(fp32_peak):.1f} ms |",
        f"| BF16 BFMMLA | {bf16_peak:g} | {ms(bf16_peak):.1f} ms |",
        f"| int8 SMMLA / USMMLA | {int8_peak:g} | {ms(int8_peak):.1f} ms |",
        f"| int8 SDOT | {MACS['sdot'] * N2['sdot']:g} | {ms(MACS['sdot'] * N2['sdot']):.1f} ms |",
    ]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, help="an already built library (default: build it)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "aarch64_disasm.md")
    args = ap.parse_args()
    lib = args.lib
    if lib is None:
        from pdlkit.runtime_abi.native_build import build_library

        lib = build_library(arch="aarch64")
    write_report(args.out, report(lib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
