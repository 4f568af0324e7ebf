"""compute_dtype='int8' (attn.scaled_dot_product_attention over attn::sdpa_forward_int8): against
PyTorch's float64 attention on the true inputs, with outlier key channels as trained models have and
with masks; the same call's results as the C++ tests check; bad input named."""
import numpy as np
import pytest

import attn

torch = pytest.importorskip("torch")


def outlier_inputs(rng, B=1, H=2, n=96, m=160, d=64, spread=30.0):
    q = rng.standard_normal((B, H, n, d)).astype(np.float32)
    k = rng.standard_normal((B, H, m, d)).astype(np.float32)
    k[..., [3, d // 4 + 1, d // 2 + 5, d - 2]] = spread * (2 + rng.standard_normal((B, H, m, 4)))
    v = rng.standard_normal((B, H, m, d)).astype(np.float32)
    return q, k, v


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


@pytest.mark.parametrize("spread", [1.0, 10.0, 50.0])
@pytest.mark.parametrize("causal", [False, True])
def test_int8_keeps_cosine_similarity_with_torch_float64(spread, causal):
    q, k, v = outlier_inputs(np.random.default_rng(3), spread=spread)
    out, lse = attn.scaled_dot_product_attention(q, k, v, causal=causal, compute_dtype="int8", return_lse=True)
    assert out.dtype == np.float32 and lse.dtype == np.float32 and out.shape == q.shape[:-1] + (v.shape[-1],)
    t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
    scores = torch.einsum("bhid,bhjd->bhij", t[0], t[1]) / np.sqrt(q.shape[-1])
    if causal:  # attn's causal=True is the top-left mask, as PyTorch's is_causal
        scores = scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), float("-inf"))
    exact = (torch.softmax(scores, dim=-1) @ t[2]).numpy()
    assert cosine(out, exact) >= 0.999
    exact_lse = torch.logsumexp(scores, dim=-1).numpy()
    assert np.abs(lse - exact_lse).max() <= 0.05 * max(1.0, np.abs(exact_lse).max())


def test_int8_with_masks_follows_float32():
    rng = np.random.default_rng(5)
    q, k, v = outlier_inputs(rng, B=2, H=4, n=70, m=90, d=24, spread=10.0)
    k, v = k[:, :2], v[:, :2]  # grouped heads
    kw = dict(valid_lens=np.array([90, 41]), window=(30, 2), alibi_slopes=np.linspace(0.1, 0.4, 4, dtype=np.float32),
              softcap=5.0, align="bottom_right")
    exact = attn.scaled_dot_product_attention(q, k, v, **kw)
    got = attn.scaled_dot_product_attention(q, k, v, compute_dtype="int8", **kw)
    assert cosine(got, exact) >= 0.999
    assert np.abs(got - exact).max() <= 0.1 * np.abs(exact).max()


def test_int8_refuses_what_it_cannot_compute():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 8, 16)).astype(np.float32) for _ in range(3))
    with pytest.raises(TypeError, match="compute_dtype='int8' takes float32 arrays; q has dtype float64"):
        attn.scaled_dot_product_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                          compute_dtype="int8")
    with pytest.raises(ValueError, match="return_weights=True needs float32 or float64 computation"):
        attn.scaled_dot_product_attention(q, k, v, return_weights=True, compute_dtype="int8")
    q[0, 1, 6, 2] = np.inf
    with pytest.raises(ValueError, match=r"q \(queries\) holds a value that is not finite in row 6 of batch 0, head 1"):
        attn.scaled_dot_product_attention(q, k, v, compute_dtype="int8")
