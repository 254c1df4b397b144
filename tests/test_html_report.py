"""explain --html: one self-contained page with the graph, regions by pattern, near misses."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import KERNEL_HEADER, lin_kernel, linear_act_pattern, write
from pdlkit.matcher.html_report import _MISS, PALETTE

import pdlkit
from pdlkit.cli import main

KERNELS = "".join(
    lin_kernel(op, name, f"return torch.{act}(x @ w.t() + b)")
    for op, name, act in [("lr", "k_relu", "relu"), ("ls", "k_sigmoid", "sigmoid")]
)
BF16_ONLY = (
    '%bf = pdl.attribute = "bfloat16"\n'
    '      pdl.apply_native_constraint "has_dtype"(%x, %bf : !pdl.value, !pdl.attribute)'
)


@pytest.fixture
def report(tmp_path, mlp):
    """fc1+relu substituted (pattern lr); fc2+sigmoid a near miss (wants bfloat16)."""
    write(tmp_path / "p", "lr.pdl.mlir", linear_act_pattern("lr", "relu", "lr", 2))
    write(tmp_path / "p", "ls.pdl.mlir", linear_act_pattern("ls", "sigmoid", "ls", 2, BF16_ONLY))
    write(tmp_path / "k", "k.py", KERNEL_HEADER + KERNELS)
    model, x = mlp
    return pdlkit.explain(model, x, patterns=[tmp_path / "p"], kernels=[tmp_path / "k"])


def test_html_shows_regions_kernels_near_misses_and_flops(report, tmp_path):
    out = tmp_path / "r.html"
    report.to_html(out)
    page = out.read_text()
    for node in ("relu", "linear"):  # the region, coloured by pattern
        assert (
            f'<g class="node sub" data-node="{node}" data-pattern="lr" data-kernel="k_relu">'
            in page
        )
    assert 'font-weight="bold">\u2192 k_relu</text>' in page  # its root names the kernel
    assert '<g class="node miss" data-node="sigmoid"' in page
    assert "constraint has_dtype(" in page and "does not hold" in page
    # fc1: 2*4*32*16 = 4096 + relu 128 offloaded; fc2 2*4*16*32 = 4096 + sigmoid 64 not
    assert '<td id="flops">4,224 of 8,384 (50.4%)</td>' in page
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )


def test_explain_command_writes_html(tmp_path, capsys):
    out = tmp_path / "demo.html"
    assert main(["explain", "pdlkit.demo:example", "--html", str(out)]) == 0
    assert out.read_text().count(">\u2192 linear") == 6  # 2 blocks x 3 linears, one label each
    assert f"wrote {out}" in capsys.readouterr().out


def _png_rgb(path: Path) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB(A) PNG (what Chromium writes) into HxWx3."""
    data = path.read_bytes()
    pos, idat, (w, h, depth, ctype) = 8, b"", (0, 0, 0, 0)
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6), (depth, ctype)
    bpp = 3 if ctype == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), dtype=np.int32)
    prev = np.zeros(w * bpp, dtype=np.int32)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        cur = np.zeros_like(line)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) % 256
        else:  # Sub, Average, Paeth depend on the pixel to the left
            for i in range(len(line)):
                a = cur[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[i] = (line[i] + pred) % 256
        out[y], prev = cur, cur
    return out.reshape(h, w, bpp)[:, :, :3]


def _pixels(img: np.ndarray, hex_color: str) -> int:
    rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(img - rgb).sum(axis=2) <= 6).sum())


def test_screenshot_shows_the_region_and_the_near_miss(report, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs headless Chromium (apt-get install chromium)")
    page, shot = tmp_path / "r.html", tmp_path / "r.png"
    report.to_html(page)
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={shot}", "--window-size=900,1000", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    img = _png_rgb(shot)
    region = _pixels(img, PALETTE[0])  # node fills of the lr region and its kernel label
    assert region > 2 * 170 * 54 * 0.7, region
    assert _pixels(img, _MISS) > 200  # the dashed outline and the "near miss" mark
