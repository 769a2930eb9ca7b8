"""sparse_attention: block-sparse attention (BSA) and DeepSeek sparse attention (DSA) for PyTorch.

    from sparse_attention import block_sparse_attention, deepseek_sparse_attention

The operators are registered with torch.library as ``torch.ops.sparse_attention.{bsa_fwd,
bsa_bwd, dsa_fwd, dsa_bwd}`` (fake kernels and autograd included), so they compose with
torch.compile(fullgraph=True) and CUDA graphs. The C++ library is loaded with ctypes from the
package (``SPARSE_ATTENTION_LIBRARY`` overrides the path); ``library_path`` says which one.
"""

from . import _indexer_ops, _ops  # noqa: F401  (register torch.ops.sparse_attention.*)
from ._abi import LIBRARY_PATH as library_path
from .functional import block_sparse_attention, deepseek_sparse_attention
from .indexer import indexer_kl_loss, indexer_scores, indexer_topk
from .metadata import (
    bsa_causal_block_metadata,
    bsa_metadata_from_block_mask,
    bsa_metadata_from_flex_block_mask,
)

try:
    from importlib.metadata import version as _version

    __version__ = _version("sparse-attention")
except Exception:  # a source checkout that was not installed
    __version__ = "0.1.0+source"

__all__ = [
    "block_sparse_attention",
    "deepseek_sparse_attention",
    "indexer_scores",
    "indexer_topk",
    "indexer_kl_loss",
    "bsa_metadata_from_block_mask",
    "bsa_metadata_from_flex_block_mask",
    "bsa_causal_block_metadata",
    "library_path",
]
