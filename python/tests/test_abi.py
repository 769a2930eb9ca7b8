"""The ctypes mirror of the C ABI matches the header: every struct's size and every field's
offset, as the system C compiler lays them out."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

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
