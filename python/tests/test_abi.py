"""The C ABI as Python sees it: the ctypes mirror matches the header (every struct's size and
every field's offset, as the system C compiler lays them out, `size` first in the extensible
structs), the library exports the C ABI only, and it runs inside a process that holds torch's
C++ runtime."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from sparse_attention import _abi

STRUCTS = [
    "sa_tensor", "sa_context", "sa_bsa_options", "sa_bsa_sparsity", "sa_bsa_fwd_args",
    "sa_bsa_bwd_args", "sa_dsa_options", "sa_dsa_fwd_args", "sa_dsa_bwd_args",
    "sa_indexer_options", "sa_indexer_scores_args", "sa_indexer_topk_args", "sa_indexer_loss_args",
]


def _header_dir():
    import sparse_attention

    pkg = Path(sparse_attention.__file__).resolve().parent
    for cand in (pkg / "include", pkg.parent.parent / "include"):
        if (cand / "sparse_attention" / "sparse_attention.h").is_file():
            return cand
    return None


def test_struct_layout_matches_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    inc = _header_dir()
    if cc is None or inc is None:
        pytest.skip("needs a C compiler and the installed header (%s, %s)" % (cc, inc))
    lines = ['#include <stdio.h>', '#include <stddef.h>',
             '#include "sparse_attention/sparse_attention.h"', 'int main(void) {']
    expected = []
    for name in STRUCTS:
        cls = getattr(_abi, name)
        lines.append('printf("%%zu\\n", sizeof(%s));' % name)
        expected.append(("sizeof(%s)" % name, ctypes.sizeof(cls)))
        for field, _ in cls._fields_:
            lines.append('printf("%%zu\\n", offsetof(%s, %s));' % (name, field))
            expected.append(("offsetof(%s, %s)" % (name, field), getattr(cls, field).offset))
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c99", "-I", str(inc), str(src), "-o", str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert len(got) == len(expected)
    mismatches = [(what, want, int(g)) for (what, want), g in zip(expected, got) if int(g) != want]
    assert not mismatches, mismatches


def test_status_names_come_from_the_library():
    assert _abi.status_name(_abi.SA_OK) == "SA_OK"
    assert _abi.status_name(_abi.SA_ERROR_UNSUPPORTED) == "SA_ERROR_UNSUPPORTED"


def test_library_is_loaded_from_the_package_or_an_explicit_path():
    import os

    path = Path(_abi.LIBRARY_PATH)
    assert path.is_file()
    if os.environ.get("SPARSE_ATTENTION_LIBRARY"):
        assert path == Path(os.environ["SPARSE_ATTENTION_LIBRARY"])


# ---- the library boundary -------------------------------------------------------------------------
def test_library_exports_only_the_c_abi():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm (binutils)")
    out = subprocess.run([nm, "-D", "--defined-only", "--format=posix", _abi.LIBRARY_PATH],
                         check=True, capture_output=True, text=True).stdout
    names = [line.split()[0].split("@")[0] for line in out.splitlines() if line.strip()]
    markers = {"_init", "_fini", "_edata", "_end", "__bss_start"}
    leaked = [n for n in names if not n.startswith("sa_") and n not in markers]
    assert not leaked, "exported outside the C ABI: %s" % leaked[:20]
    assert sum(n.startswith("sa_") for n in names) >= 10
    # The extensible structs' initializers are header inline functions (they give the caller's
    # sizeof), never library symbols.
    initializers = [n for n in names if n.endswith(("_options_default", "_args_default"))]
    assert not initializers, "initializers exported: %s" % initializers


def _dsa_bwd_shape_args(d_v=0, impl=_abi.SA_IMPL_AUTO):
    from sparse_attention import _ops

    q, kv = torch.zeros(2, 1, 8), torch.zeros(4, 8)
    idx = torch.zeros(2, 2, dtype=torch.int32)
    out, lse = torch.zeros(2, 1, d_v or 512), torch.zeros(2, 1)
    options = _ops._dsa_options(d_v, 0.0, False)
    options.impl = impl
    return _ops._dsa_bwd_args(out, q, kv, out, lse, idx, None, None, q, kv, None, options, True)


def test_error_messages_inside_a_torch_process():
    """torch, with its C++ runtime, is loaded before the library (as in every PyTorch program).
    Calls whose errors the library formats with std::ostream report their message (they crashed
    when the library exported an embedded static libstdc++)."""
    with pytest.raises(ValueError, match=r"options\.d_v: .*512"):
        _abi.validate_shapes("dsa_backward", _dsa_bwd_shape_args(d_v=0))
    with pytest.raises(NotImplementedError, match=r"sm90"):
        _abi.validate_shapes("dsa_backward", _dsa_bwd_shape_args(d_v=8, impl=3))
    _abi.validate_shapes("dsa_backward", _dsa_bwd_shape_args(d_v=8))


# ---- extensible structs ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in STRUCTS if n not in ("sa_tensor", "sa_context",
                                                                   "sa_bsa_sparsity")])
def test_structs_carry_their_size(name):
    cls = getattr(_abi, name)
    assert cls.size.offset == 0
    assert cls().size == ctypes.sizeof(cls)


def test_garbage_sizes_are_refused_by_name():
    args = _dsa_bwd_shape_args(d_v=8)
    args.size = 3
    with pytest.raises(ValueError, match=r"args\.size: expected at least \d+ \(the first "
                                         r"version's size\) and at most 65536, got 3"):
        _abi.validate_shapes("dsa_backward", args)
    args = _dsa_bwd_shape_args(d_v=8)
    args.options.size = 0
    with pytest.raises(ValueError, match=r"args\.options\.size: 0, an uninitialised struct"):
        _abi.validate_shapes("dsa_backward", args)


def _indexer_scores_shape_args():
    from sparse_attention import _indexer_ops

    q_I, k_I, w = torch.zeros(2, 1, 4), torch.zeros(3, 4), torch.zeros(2, 1)
    return _indexer_ops._scores_args(q_I, k_I, w, None, None, torch.zeros(2, 3),
                                     _indexer_ops._options(), True)


def test_indexer_garbage_sizes_are_refused_by_name():
    _abi.validate_shapes("indexer_scores", _indexer_scores_shape_args())
    args = _indexer_scores_shape_args()
    args.size = 0
    with pytest.raises(ValueError, match=r"args\.size: 0, an uninitialised struct: start from "
                                         r"sa_indexer_scores_args_default\(\)"):
        _abi.validate_shapes("indexer_scores", args)
    args = _indexer_scores_shape_args()
    args.options.size = 3
    with pytest.raises(ValueError, match=r"args\.options\.size: expected at least \d+ \(the "
                                         r"first version's size\) and at most 65536, got 3"):
        _abi.validate_shapes("indexer_scores", args)
