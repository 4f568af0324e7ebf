"""attn.show_heatmaps: d2l.show_heatmaps into SVG and PNG files, the same pictures as the
command line draws (attn sdpa --heatmap), byte for byte."""
import math
import os
import pathlib
import re
import struct
import subprocess

import numpy as np
import pytest

import attn

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def d2l_weights():
    # The d2l chapter's heatmap cell: attention.attention_weights of the additive example, (2, 1, 10).
    return np.array([[[0.5] * 2 + [0] * 8], [[1 / 6] * 6 + [0] * 4]], np.float32)


def test_the_d2l_heatmap_cell(tmp_path):
    # d2l.show_heatmaps(attention.attention_weights.reshape((1, 1, 2, 10)), xlabel='Keys', ylabel='Queries')
    matrices = d2l_weights().reshape((1, 1, 2, 10))
    svg = attn.show_heatmaps(matrices, xlabel="Keys", ylabel="Queries", path=str(tmp_path / "weights.svg"))
    png = attn.show_heatmaps(matrices, xlabel="Keys", ylabel="Queries", path=tmp_path / "weights.png")
    assert svg == str(tmp_path / "weights.svg") and png == str(tmp_path / "weights.png")
    text = (tmp_path / "weights.svg").read_text()
    assert text.startswith("<svg") or text.startswith("<?xml")
    assert "Keys" in text and "Queries" in text
    # The cells, one rect per run of equal values, 22 units a key: row 0 has 2 keys at the largest
    # value (Reds' last stop) and 8 at 0 (its first); row 1 has 6 keys at 1/6, a third of the scale
    # [0, 0.5]: 2/3 of the way from stop 2 (#fcbba1) to stop 3 (#fc9272) of 8, #fca082 to a rounding;
    # then 4 keys at 0.
    cells = text[text.index('<g shape-rendering="crispEdges">'):]
    cells = re.findall(r'<rect [^>]*width="([0-9.]+)" [^>]*fill="(#[0-9a-f]{6})"', cells[:cells.index("</g>")])
    assert cells == [("44", "#67000d"), ("176", "#fff5f0"), ("132", "#fca082"), ("88", "#fff5f0")], cells
    # The PNG is the SVG's layout at twice its size (its IHDR's width and height).
    png = (tmp_path / "weights.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    width, height = (float(x) for x in re.search(r'<svg [^>]*width="([0-9.]+)" height="([0-9.]+)"', text).groups())
    assert struct.unpack(">II", png[16:24]) == (math.ceil(2 * width), math.ceil(2 * height))


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (2, 2, 3, 4)])
def test_grids_titles_and_colormaps(tmp_path, shape, rng):
    matrices = rng.random(shape)
    cols = shape[-3] if len(shape) > 2 else 1
    titles = [f"head {c}" for c in range(cols)]
    plain = attn.show_heatmaps(matrices, path=tmp_path / "plain.svg")
    titled = attn.show_heatmaps(matrices, "k", "q", titles, path=tmp_path / "titled.svg", cmap="viridis")
    plain_svg, titled_svg = pathlib.Path(plain).read_text(), pathlib.Path(titled).read_text()
    assert all(f">{t}</text>" in titled_svg for t in titles)
    # The smallest and largest value take the colormap's ends: Reds' by default, viridis' when asked.
    reds, viridis = ("#fff5f0", "#67000d"), ("#440154", "#fde725")
    for svg, ends, other in ((plain_svg, reds, viridis), (titled_svg, viridis, reds)):
        assert all(f'fill="{c}"' in svg for c in ends) and not any(f'fill="{c}"' in svg for c in other)
    # float32 and float64 matrices of the same values draw the same picture.
    attn.show_heatmaps(matrices.astype(np.float32), path=tmp_path / "f32.svg")
    attn.show_heatmaps(matrices.astype(np.float32).astype(np.float64), path=tmp_path / "f64.svg")
    assert (tmp_path / "f32.svg").read_bytes() == (tmp_path / "f64.svg").read_bytes()


def test_the_same_pictures_as_the_command_line(tmp_path, rng):
    # `attn sdpa ... --heatmap` draws the weights (B, n, m) as a column of heatmaps titled
    # "batch b"; show_heatmaps on attn's weights with those titles draws the same files.
    cli = os.environ.get("ATTN_CLI", "")
    if not os.path.isfile(cli):
        pytest.skip("ATTN_CLI does not name the built `attn` command line (tests/python.cmake sets it)")
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (2, 7, 4), (2, 7, 5)))
    lens = np.array([4, 7])
    for name, a in (("q", q), ("k", k), ("v", v), ("lens", lens)):
        np.save(tmp_path / f"{name}.npy", a)
    for ext in ("svg", "png"):
        subprocess.run([cli, "sdpa", "--queries", tmp_path / "q.npy", "--keys", tmp_path / "k.npy", "--values",
                        tmp_path / "v.npy", "--valid-lens", tmp_path / "lens.npy", "--out", tmp_path / "out.npy",
                        "--heatmap", tmp_path / f"cli.{ext}"], check=True, capture_output=True)
        _, weights = attn.scaled_dot_product_attention(q, k, v, lens, return_weights=True)
        attn.show_heatmaps(weights[:, None], titles=["batch 0", "batch 1"], path=tmp_path / f"python.{ext}")
        assert (tmp_path / f"python.{ext}").read_bytes() == (tmp_path / f"cli.{ext}").read_bytes(), ext


def test_plot_draws_named_curves_and_names_bad_ones(tmp_path):
    steps = np.arange(50)
    path = attn.plot(tmp_path / "loss.svg", {"textbook": (steps, np.exp(-steps / 10)), "attn": (steps, np.exp(-steps / 12))},
                     title="training loss", xlabel="step", ylabel="loss")
    text = pathlib.Path(path).read_text()
    for word in ("textbook", "attn", "training loss", "step", "loss"):
        assert word in text
    # Each curve is a line through its 50 points in its colour of tab10's cycle, placed by one affine
    # map of (step, loss) to the page (the coordinates written to 2 decimals).
    lines = [re.search(rf'<polyline [^>]*stroke="{colour}"[^>]*points="([^"]*)"', text) for colour in ("#1f77b4", "#ff7f0e")]
    points = [np.array([p.split(",") for p in line.group(1).split()], float) for line in lines]
    assert [len(p) for p in points] == [50, 50]
    x0, x1, y0 = points[0][0, 0], points[0][-1, 0], points[0][0, 1]
    sx, sy = (x1 - x0) / 49, (points[0][-1, 1] - y0) / (np.exp(-4.9) - 1)
    for loss, p in zip((np.exp(-steps / 10), np.exp(-steps / 12)), points):
        np.testing.assert_allclose(p[:, 0], x0 + sx * steps, rtol=0, atol=0.011)
        np.testing.assert_allclose(p[:, 1], y0 + sy * (loss - 1), rtol=0, atol=0.011)
    assert attn.plot(tmp_path / "loss.png", {"a": ([0, 1], [1, 0])}).endswith("loss.png")
    assert (tmp_path / "loss.png").read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(ValueError, match=r"plot: .*\(\"a\"\) has 3 x values but 2"):
        attn.plot(tmp_path / "bad.svg", {"a": ([0, 1, 2], [1, 0])})
    with pytest.raises(TypeError, match=r'curves\["a"\] must be a pair'):
        attn.plot(tmp_path / "bad.svg", {"a": [0, 1, 2]})
