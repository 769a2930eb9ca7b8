"""ctypes binding of the C ABI (include/sparse_attention/sparse_attention.h).

Nothing here knows about autograd or torch.library: it turns torch tensors into `sa_tensor`
views, fills the argument structs, runs a call on the caller's current CUDA stream with workspace
from PyTorch's caching allocator, and turns a failed `sa_status` into a Python exception carrying
`sa_last_error()`.

The structs mirror the header field by field; tests/test_abi.py compiles the header with the
system C compiler and compares every size and offset.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
from pathlib import Path
from typing import Optional

import torch

# ---- status codes and the one error convention ---------------------------------------------------
SA_OK = 0
SA_ERROR_INVALID_ARGUMENT = 1
SA_ERROR_UNSUPPORTED = 2
SA_ERROR_INVALID_METADATA = 3
SA_ERROR_WORKSPACE = 4
SA_ERROR_CUDA = 5
SA_ERROR_INTERNAL = 6

# dtypes, devices, layouts, implementations (enums are C ints)
_DTYPES = {
    torch.bfloat16: 0,
    torch.float16: 1,
    torch.float32: 2,
    torch.float64: 3,
    torch.int32: 4,
}
SA_DEVICE_CPU = 0
SA_DEVICE_CUDA = 1
SA_LAYOUT_BHSD = 0
SA_LAYOUT_BSHD = 1
SA_IMPL_AUTO = 0
SA_MASK_NONE = 0
SA_MASK_CAUSAL = 1
SA_MASK_WINDOW = 2
SA_MASK_CAUSAL_WINDOW = 3
SA_MAX_RANK = 4


class sa_tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * SA_MAX_RANK),
        ("strides", ctypes.c_int64 * SA_MAX_RANK),
        ("device", ctypes.c_int),
        ("device_index", ctypes.c_int32),
    ]


sa_alloc_fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p)
sa_free_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class sa_context(ctypes.Structure):
    _fields_ = [
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("alloc", sa_alloc_fn),
        ("free", sa_free_fn),
        ("allocator_user", ctypes.c_void_p),
        ("impl_used", ctypes.POINTER(ctypes.c_int)),
    ]


class _Extensible(ctypes.Structure):
    """An options or args struct of the C ABI: its first field, `size`, is its size in bytes,
    set here on construction (the header's "Extensible structs" rule: the library reads only
    the fields inside the caller's size). Every other field starts at 0."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.size = ctypes.sizeof(self)


class sa_bsa_options(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("scale", ctypes.c_float),
        ("layout", ctypes.c_int),
        ("block_size", ctypes.c_int32),
        ("count", ctypes.c_int32),
        ("bucket_size", ctypes.c_int32),
        ("validate", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("impl", ctypes.c_int),
        # version 2: token masks
        ("causal_offset", ctypes.c_int64),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("mask", ctypes.c_int),
        ("causal_offset_given", ctypes.c_int32),
        # version 3: packed batches (all-zero: absent, a dense batch)
        ("cu_seqlens_q", sa_tensor),
        ("cu_seqlens_k", sa_tensor),
    ]


class sa_bsa_sparsity(ctypes.Structure):
    _fields_ = [("q2k_index", sa_tensor), ("q2k_count", sa_tensor), ("kv_block_len", sa_tensor)]


class sa_bsa_fwd_args(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q", sa_tensor),
        ("k", sa_tensor),
        ("v", sa_tensor),
        ("sparsity", sa_bsa_sparsity),
        ("o", sa_tensor),
        ("lse", sa_tensor),
        ("options", sa_bsa_options),
    ]


class sa_bsa_bwd_args(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q", sa_tensor),
        ("k", sa_tensor),
        ("v", sa_tensor),
        ("o", sa_tensor),
        ("lse", sa_tensor),
        ("dout", sa_tensor),
        ("sparsity", sa_bsa_sparsity),
        ("dq", sa_tensor),
        ("dk", sa_tensor),
        ("dv", sa_tensor),
        ("options", sa_bsa_options),
    ]


class sa_dsa_options(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("scale", ctypes.c_float),
        ("d_v", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("impl", ctypes.c_int),
    ]


class sa_dsa_fwd_args(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q", sa_tensor),
        ("kv", sa_tensor),
        ("topk_idx", sa_tensor),
        ("topk_length", sa_tensor),
        ("sink", sa_tensor),
        ("out", sa_tensor),
        ("lse", sa_tensor),
        ("options", sa_dsa_options),
    ]


class sa_dsa_bwd_args(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q", sa_tensor),
        ("kv", sa_tensor),
        ("topk_idx", sa_tensor),
        ("topk_length", sa_tensor),
        ("sink", sa_tensor),
        ("out", sa_tensor),
        ("lse", sa_tensor),
        ("dout", sa_tensor),
        ("dq", sa_tensor),
        ("dkv", sa_tensor),
        ("d_sink", sa_tensor),
        ("options", sa_dsa_options),
    ]


class sa_indexer_options(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("scale_I", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("coeff", ctypes.c_float),
        ("deterministic", ctypes.c_int32),
        ("impl", ctypes.c_int),
    ]


class sa_indexer_scores_args(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q_I", sa_tensor),
        ("k_I", sa_tensor),
        ("w", sa_tensor),
        ("k_start", sa_tensor),
        ("k_end", sa_tensor),
        ("scores", sa_tensor),
        ("options", sa_indexer_options),
    ]


class sa_indexer_topk_args(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q_I", sa_tensor),
        ("k_I", sa_tensor),
        ("w", sa_tensor),
        ("k_start", sa_tensor),
        ("k_end", sa_tensor),
        ("topk_idx", sa_tensor),
        ("topk_length", sa_tensor),
        ("options", sa_indexer_options),
    ]


class sa_indexer_loss_args(_Extensible):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q_I", sa_tensor),
        ("k_I", sa_tensor),
        ("w", sa_tensor),
        ("q", sa_tensor),
        ("kv", sa_tensor),
        ("lse", sa_tensor),
        ("topk_idx", sa_tensor),
        ("topk_length", sa_tensor),
        ("k_start", sa_tensor),
        ("k_end", sa_tensor),
        ("loss", sa_tensor),
        ("loss_per_token", sa_tensor),
        ("dq_I", sa_tensor),
        ("dk_I", sa_tensor),
        ("dw", sa_tensor),
        ("options", sa_indexer_options),
    ]


# ---- loading the library ------------------------------------------------------------------------
_LIB_NAME = "libsparse_attention.so"


def _candidates():
    env = os.environ.get("SPARSE_ATTENTION_LIBRARY")
    if env:
        # An explicit choice is the only candidate: no silent fallback to another build.
        yield Path(env)
        return
    here = Path(__file__).resolve().parent
    yield here / "lib" / _LIB_NAME  # installed wheel (CMake install prefix = package folder)
    yield here / "_lib" / _LIB_NAME  # a copy placed in a source checkout
    yield here.parent.parent / "build" / _LIB_NAME  # source checkout after scripts/build.sh


def _load() -> ctypes.CDLL:
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            break
    else:
        raise ImportError(
            "sparse_attention: cannot find %s (looked in: %s); install the package with "
            "`pip install .` or set SPARSE_ATTENTION_LIBRARY" % (_LIB_NAME, ", ".join(tried))
        )
    lib.sa_status_name.restype = ctypes.c_char_p
    lib.sa_status_name.argtypes = [ctypes.c_int]
    lib.sa_last_error.restype = ctypes.c_char_p
    lib.sa_last_error.argtypes = []
    for op, args_t in (
        ("bsa_forward", sa_bsa_fwd_args),
        ("bsa_backward", sa_bsa_bwd_args),
        ("dsa_forward", sa_dsa_fwd_args),
        ("dsa_backward", sa_dsa_bwd_args),
        ("indexer_scores", sa_indexer_scores_args),
        ("indexer_topk", sa_indexer_topk_args),
        ("indexer_loss", sa_indexer_loss_args),
    ):
        ws = getattr(lib, "sa_%s_workspace_size" % op)
        ws.restype = ctypes.c_int
        ws.argtypes = [ctypes.POINTER(args_t), ctypes.POINTER(ctypes.c_size_t)]
        run = getattr(lib, "sa_%s" % op)
        run.restype = ctypes.c_int
        run.argtypes = [ctypes.POINTER(args_t), ctypes.POINTER(sa_context)]
    lib._sa_path = str(path)
    return lib


LIB = _load()
LIBRARY_PATH: str = LIB._sa_path


# ---- errors -------------------------------------------------------------------------------------
def status_name(status: int) -> str:
    return LIB.sa_status_name(status).decode()


def exception_for(status: int, message: str) -> Exception:
    """The Python exception of a failed call: ValueError for bad arguments or metadata,
    NotImplementedError for a valid request no implementation serves, RuntimeError otherwise.
    The message is the library's, prefixed with the status name."""
    text = "%s: %s" % (status_name(status), message)
    if status in (SA_ERROR_INVALID_ARGUMENT, SA_ERROR_INVALID_METADATA):
        return ValueError(text)
    if status == SA_ERROR_UNSUPPORTED:
        return NotImplementedError(text)
    return RuntimeError(text)


def check(status: int) -> None:
    if status != SA_OK:
        # sa_last_error() is per thread and this is the thread that made the call.
        raise exception_for(status, LIB.sa_last_error().decode(errors="replace"))


# ---- tensor views -------------------------------------------------------------------------------
_FAKE_DATA = 256  # a non-null, aligned placeholder address for shape-only validation


def _concrete(values) -> bool:
    return all(type(v) is int for v in values)


def can_describe(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether the shapes and strides are plain ints (not symbolic), so that the library can
    validate them without data (see `view(..., shape_only=True)`)."""
    for t in tensors:
        if t is None or isinstance(t, Planned):
            continue
        if not (_concrete(t.shape) and _concrete(t.stride())):
            return False
    return True


class Planned:
    """An output that is not allocated yet: its shape and dtype (contiguous). Its view lets the
    library validate a call's shapes before the outputs are allocated."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype: torch.dtype):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype

    @classmethod
    def of(cls, shape, dtype: torch.dtype):
        """Planned(shape, dtype), or None (absent) when the shape is not known."""
        return None if shape is None else cls(shape, dtype)

    def dim(self) -> int:
        return len(self.shape)

    def stride(self):
        out, step = [], 1
        for n in reversed(self.shape):
            out.append(step)
            step *= max(n, 1)
        return tuple(reversed(out))


def _invalid(message: str) -> ValueError:
    return ValueError("SA_ERROR_INVALID_ARGUMENT: " + message)


def view(t, shape_only: bool = False, name: str = "tensor") -> sa_tensor:
    """The `sa_tensor` view of a torch tensor (`None` -> absent; a `Planned` output -> a
    shape-only view). With shape_only, the view carries a placeholder address and says CPU: it
    lets the library check ranks, shapes, dtypes and strides of fake or meta tensors without
    touching memory (CUDA-only checks wait for the real call). `name` is the argument's name in
    error messages ("q", "sparsity.q2k_index", ...), as the library names it."""
    v = sa_tensor()
    if t is None:
        return v  # data NULL: absent
    if t.dim() > SA_MAX_RANK:
        raise _invalid(
            "%s: expected rank <= %d (the library's tensors), got rank %d %s"
            % (name, SA_MAX_RANK, t.dim(), list(t.shape))
        )
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise _invalid(
            "%s: unsupported dtype %s (the library takes bfloat16, float16, float32, float64 "
            "and int32 tensors)" % (name, t.dtype)
        )
    v.dtype = dtype
    v.rank = t.dim()
    for i, (n, s) in enumerate(zip(t.shape, t.stride())):
        v.shape[i] = int(n)
        v.strides[i] = int(s)
    if shape_only or isinstance(t, Planned):
        v.data = _FAKE_DATA
        v.device = SA_DEVICE_CPU
        v.device_index = 0
        return v
    ptr = t.data_ptr()
    v.data = ptr if ptr != 0 else (_FAKE_DATA if t.numel() == 0 and t.device.type == "cpu" else 0)
    if t.device.type == "cuda":
        v.device = SA_DEVICE_CUDA
        v.device_index = t.device.index if t.device.index is not None else 0
    elif t.device.type == "cpu":
        v.device = SA_DEVICE_CPU
    else:
        raise _invalid(
            "%s: tensor on device %s: the library takes CPU and CUDA tensors" % (name, t.device)
        )
    return v


# ---- scalar options -----------------------------------------------------------------------------
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# The largest |scale| the library takes (scale * log2(e) finite in fp32), and the smallest normal
# fp32 value; the C ABI's SA_ERROR_INVALID_ARGUMENT names the same bounds.
SCALE_MAX = 2.35865e38
SCALE_MIN = 1.1754943508222875e-38


def int32_option(value: int, name: str, expected: str) -> int:
    """A Python int headed for an int32 field of the C structs, range-checked (ctypes would
    silently keep the low 32 bits)."""
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int):
        raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    if not INT32_MIN <= value <= INT32_MAX:
        raise _invalid("%s: expected %s, got %d (outside int32)" % (name, expected, value))
    return value


def int64_option(value: int, name: str, expected: str) -> int:
    """A Python int headed for an int64 field of the C structs, range-checked."""
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int):
        raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__))
    if not -(1 << 63) <= value < (1 << 63):
        raise _invalid("%s: expected %s, got %d (outside int64)" % (name, expected, value))
    return value


def scale_option(scale: float, default_doc: str, name: str = "scale") -> float:
    """The operators' scale (0.0: the default) headed for the C structs' float field
    `options.<name>`: a nonzero scale must survive the conversion to fp32 unchanged in kind (no
    underflow to 0 or a subnormal, no overflow to inf)."""
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError("%s: expected a float, got %s" % (name, type(scale).__name__))
    scale = float(scale)
    if scale != 0.0 and not (
        math.isfinite(scale) and SCALE_MIN <= abs(scale) <= SCALE_MAX
    ):
        raise _invalid(
            "options.%s: expected 0 (for %s) or a finite value with %.8g <= |%s| <= %.6g, "
            "got %r" % (name, default_doc, SCALE_MIN, name, SCALE_MAX, scale)
        )
    return scale


FLT_MAX = 3.4028234663852886e38


def float_option(value: float, name: str) -> float:
    """A Python number headed for a float field of the C structs (`options.<name>`): a finite
    value must stay finite in fp32 (ctypes would store inf); NaN and inf go on to the library,
    which names them."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError("%s: expected a float, got %s" % (name, type(value).__name__))
    value = float(value)
    if math.isfinite(value) and abs(value) > FLT_MAX:
        raise _invalid("options.%s: expected a finite value (|%s| <= %.8g in fp32), got %r"
                       % (name, name, FLT_MAX, value))
    return value


# The implementation that served the last call on this process (benchmarks and logs read it).
_IMPL_NAMES = {0: "auto", 1: "reference", 2: "portable", 3: "sm90"}
LAST_IMPL_NAME: Optional[str] = None


# ---- running a call -----------------------------------------------------------------------------
def validate_shapes(op: str, args) -> None:
    """Shape-only validation (args built with view(..., shape_only=True), outputs `Planned`): the
    library's checks and messages before any output is allocated, and at trace time for fake and
    meta tensors."""
    nbytes = ctypes.c_size_t(0)
    check(getattr(LIB, "sa_%s_workspace_size" % op)(ctypes.byref(args), ctypes.byref(nbytes)))


def validate_shapes_once(op: str, options, tensors, build_args) -> None:
    """validate_shapes(op, build_args()) for a call shape not seen before: the key is the options
    and each input's shape, strides and dtype (the planned outputs follow from them), so a
    repeated call shape costs a dictionary lookup. Errors are raised every time."""
    key = (op, ctypes.string_at(ctypes.addressof(options), ctypes.sizeof(options)),
           tuple(None if t is None else (tuple(t.shape), t.stride(), t.dtype) for t in tensors))
    if key in _SHAPES_OK:
        return
    validate_shapes(op, build_args())
    if len(_SHAPES_OK) >= _WS_CACHE_MAX:
        _SHAPES_OK.pop(next(iter(_SHAPES_OK)))
    _SHAPES_OK[key] = True


# Workspace sizes by call shape: the size depends on shapes, strides, dtypes, devices, options and
# which optional tensors are present, never on data pointers or values, so a repeated call shape
# skips the size query (one full validation of the arguments, cudaPointerGetAttributes per tensor,
# instead of two per call; the call itself still validates everything).
_WS_CACHE: dict = {}
_WS_CACHE_MAX = 256
_SHAPES_OK: dict = {}  # call shapes that passed validate_shapes (insertion-ordered, bounded)
_DATA_OFFSETS: dict = {}


def _data_offsets(struct_t) -> list:
    """Byte offsets of every sa_tensor.data pointer inside an argument struct type."""
    if struct_t not in _DATA_OFFSETS:
        out = []

        def walk(t, base):
            for name, ftype in t._fields_:
                off = base + getattr(t, name).offset
                if ftype is sa_tensor:
                    out.append(off + sa_tensor.data.offset)
                elif isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
                    walk(ftype, off)

        walk(struct_t, 0)
        _DATA_OFFSETS[struct_t] = out
    return _DATA_OFFSETS[struct_t]


def _call_shape_key(op: str, args) -> tuple:
    """The call's bytes with each data pointer reduced to present / absent."""
    raw = bytearray(ctypes.string_at(ctypes.addressof(args), ctypes.sizeof(args)))
    size = ctypes.sizeof(ctypes.c_void_p)
    for off in _data_offsets(type(args)):
        present = any(raw[off:off + size])
        raw[off:off + size] = bytes([1 if present else 0]) + bytes(size - 1)
    return (op, bytes(raw))


def workspace_bytes(op: str, args) -> int:
    """`sa_<op>_workspace_size` for this call shape (cached; errors are raised, not cached).

    Caching is exact: the library reads no environment or other process state that could change
    the size (its kernel tuning is internal, reachable only by the in-tree bench and tests).
    """
    key = _call_shape_key(op, args)
    nbytes = _WS_CACHE.get(key)
    if nbytes is None:
        out = ctypes.c_size_t(0)
        check(getattr(LIB, "sa_%s_workspace_size" % op)(ctypes.byref(args), ctypes.byref(out)))
        nbytes = out.value
        if len(_WS_CACHE) >= _WS_CACHE_MAX:
            _WS_CACHE.pop(next(iter(_WS_CACHE)))
        _WS_CACHE[key] = nbytes
    return nbytes


def run(op: str, args, device: torch.device) -> None:
    """Runs `sa_<op>` with workspace from PyTorch's allocator, on the current CUDA stream of
    `device` (CPU tensors: the reference, no stream). No host synchronisation."""
    forced = os.environ.get("SPARSE_ATTENTION_FORCE_IMPL")
    if forced:  # benchmarks and tests: pin one implementation (an error if it cannot serve)
        args.options.impl = {v: k for k, v in _IMPL_NAMES.items()}[forced]
    ctx = sa_context()
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:
        if device.type == "cuda":
            ctx.stream = torch.cuda.current_stream(device).cuda_stream
        nbytes = workspace_bytes(op, args)
        workspace = None
        if nbytes > 0:
            # Stream-ordered by the caching allocator: back in the pool (for this stream) when the
            # call returns; while a CUDA graph captures, the graph's pool keeps it.
            workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
            ctx.workspace = workspace.data_ptr()
            ctx.workspace_bytes = nbytes
        used = ctypes.c_int(0)
        ctx.impl_used = ctypes.pointer(used)
        check(getattr(LIB, "sa_%s" % op)(ctypes.byref(args), ctypes.byref(ctx)))
        global LAST_IMPL_NAME
        LAST_IMPL_NAME = _IMPL_NAMES.get(used.value, "unknown")
        del workspace
