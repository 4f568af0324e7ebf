"""attn: attention scoring functions, computed by the attn C++ library.

The chapter's PyTorch code as NumPy functions and layers (masked_softmax, bmm,
scaled_dot_product_attention, nadaraya_watson, the layers DotProductAttention, AdditiveAttention
and MultiHeadAttention with their backward passes), a KVCache for decoding, show_heatmaps and plot,
and kernel regression: KernelReg (statsmodels' interface; attn/kernel_reg.py) and plug_in_bandwidth.
They live in the compiled module attn._attn (KernelReg in attn.kernel_reg, over attn._attn) and are
re-exported here; ``help(attn._attn)`` says how arrays are read.

``attn.torch`` (imported on its own, ``import attn.torch``; it needs PyTorch) offers the same
kernels to PyTorch: torch.autograd functions and nn.Modules.
"""
from ._attn import *  # noqa: F401,F403  (the compiled functions and classes)
from ._attn import __version__  # noqa: F401
from .kernel_reg import KernelReg  # noqa: F401
