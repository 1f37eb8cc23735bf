"""Element types: what malloc takes as a dtype, turned into the array-interface typestr a Buffer
exports ("<f4") and its item size in bytes.

A dtype is a typestr ("<f4", "f4", "|u1"), a NumPy name ("float32", "uint8", "bool"), a NumPy dtype
or scalar type (np.dtype("f4"), np.float32: anything numpy.dtype() takes, where NumPy is installed),
a PyTorch dtype of the same name (torch.float32), or an int item size for opaque elements ("|V<n>").
Each is checked here, so what a Buffer exports is a typestr its consumers read as meant: sizes are
ASCII digits ('<f\\u0664' was stored and exported: issue 35 row 10), each kind has the sizes NumPy
gives it on this machine ("<f3" is no type; "<f12" is a long double of 32-bit x86 only), a datetime
has a unit NumPy knows, "U" counts 4-byte characters, and "O" (Python object pointers) is refused:
a consumer would read refpool's raw bytes as references to objects."""
import ctypes
import functools
import re
import sys

from . import _checked

_NATIVE = "<" if sys.byteorder == "little" else ">"
_TYPESTR = re.compile(r"([<>|=]?)([biufcmMOSUV])([0-9]*)(\[[0-9]*[A-Za-z]+\])?\Z")
# What is handed to numpy.dtype() as a name ("single", "datetime64[ns]"): NumPy also reads '<f 4'
# and '<f+4' as '<f4', which no typestr is.
_NUMPY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\[[0-9]*[A-Za-z]+\])?\Z")
# kind -> the item sizes NumPy has for it here (None: any size of at least one): its long double is
# C's, 16 bytes on x86-64 (12 on 32-bit x86, 8 where it is a double).
_LONG_DOUBLE = ctypes.sizeof(ctypes.c_longdouble)
_SIZES = {"b": {1}, "i": {1, 2, 4, 8}, "u": {1, 2, 4, 8}, "f": {2, 4, 8, _LONG_DOUBLE},
          "c": {8, 16, 2 * _LONG_DOUBLE}, "m": {8}, "M": {8}, "S": None, "U": None, "V": None}
# A datetime's unit, with an optional multiplier (a C int to NumPy): "[ns]", "[25us]", "[generic]".
_UNIT = re.compile(r"\[([0-9]{0,10})(Y|M|W|D|h|m|s|ms|us|ns|ps|fs|as|generic)\]\Z")
_INT_MAX = 2**31 - 1
_SIZE_DIGITS = len(str(2**64 - 1))  # the most digits an item size can have
# NumPy's names of the fixed-size types, so "float32" needs no NumPy.
_NAMES = {"bool": "|b1", "int8": "|i1", "uint8": "|u1", "float16": "=f2", "float32": "=f4", "float64": "=f8",
          "complex64": "=c8", "complex128": "=c16",
          **{f"{sign}int{bits}": f"={sign or 'i'}{bits // 8}" for sign in ("", "u") for bits in (16, 32, 64)}}
_EXAMPLES = "a typestr such as '<f4' or '|u1', a name such as 'float32', a NumPy dtype, or an item size in bytes"


def resolve(dtype):
    """(typestr, item size) of `dtype`; TypeError for what is no dtype, ValueError for a bad one."""
    if dtype is None or isinstance(dtype, (bool, float)):
        raise TypeError(f"refpool: dtype must be {_EXAMPLES}, not {dtype!r}")
    if isinstance(dtype, int) or (not isinstance(dtype, str) and hasattr(type(dtype), "__index__")):
        return _opaque(dtype)
    if isinstance(dtype, str):
        text = _NAMES.get(dtype, dtype)
        return parse(text) if _TYPESTR.match(text) or not _NUMPY_NAME.match(text) else _from_numpy(text)
    text = getattr(dtype, "str", None)  # a NumPy dtype, or any object that carries its typestr
    if isinstance(text, str):
        return parse(text)
    if type(dtype).__module__ == "torch" and str(dtype).startswith("torch."):
        name = str(dtype)[len("torch."):]
        if name in _NAMES:
            return parse(_NAMES[name])
        raise ValueError(f"refpool: dtype {dtype} has no array-interface typestr")
    return _from_numpy(dtype)


def _opaque(size):
    size = _checked.integer(ctypes.c_size_t, size, "dtype (item size)")
    if size == 0:
        raise ValueError("refpool: dtype (item size) is 0; an element has at least one byte")
    return ("|u1" if size == 1 else f"|V{size}"), size


def _from_numpy(dtype):
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        if isinstance(dtype, numpy.generic):  # numpy.dtype() would read the value's .dtype
            raise TypeError(f"refpool: dtype must be {_EXAMPLES}, not the NumPy value {dtype!r} (its type is "
                            f"numpy.{type(dtype).__name__})")
        try:
            return parse(numpy.dtype(dtype).str)
        except (TypeError, ValueError) as e:
            if isinstance(e, ValueError) and str(e).startswith("refpool: "):
                raise
            if not isinstance(dtype, str):
                raise TypeError(f"refpool: dtype must be {_EXAMPLES}, not {dtype!r}") from None
    if isinstance(dtype, str):
        raise ValueError(f"refpool: dtype {dtype!r} is not {_EXAMPLES}")
    raise TypeError(f"refpool: dtype must be {_EXAMPLES}, not {dtype!r} (NumPy, which may know it, is not "
                    "installed here)")


@functools.lru_cache(maxsize=256)
def parse(text):
    """(canonical typestr, item size) of an array-interface typestr, as numpy.dtype(text).str spells
    it: the machine's byte order where none is given, "|" for types of one byte and S, V, b."""
    match = _TYPESTR.match(text)
    if match is None or not (match.group(3) or match.group(2) == "O"):
        raise ValueError(f"refpool: dtype {text!r} is not {_EXAMPLES}")
    order, kind, digits, unit = match.groups()
    sizes = _SIZES.get(kind)
    if kind == "O":
        raise ValueError(f"refpool: dtype {text!r} holds Python objects; refpool memory holds raw bytes, which a "
                         "consumer would read as object references")
    if len(digits.lstrip("0")) > _SIZE_DIGITS:  # before int(), which refuses more than 4300 digits
        raise OverflowError(f"refpool: dtype {text[:40]!r}... has a size of {len(digits)} digits, beyond size_t")
    count = int(digits)
    if count == 0 or (sizes is not None and count not in sizes):
        allowed = ", ".join(map(str, sorted(sizes))) if sizes else "at least 1"
        raise ValueError(f"refpool: dtype {text!r} has no type: kind {kind!r} comes in {allowed} bytes")
    if unit and kind not in "mM":
        raise ValueError(f"refpool: dtype {text!r}: only datetime kinds (m, M) take a unit")
    unit_match = _UNIT.match(unit or "")
    if unit and (unit_match is None or int(unit_match.group(1) or 1) > _INT_MAX):
        raise ValueError(f"refpool: dtype {text!r} has no datetime unit NumPy knows: [N]UNIT with UNIT one of Y, M, "
                         "W, D, h, m, s, ms, us, ns, ps, fs, as, generic")
    size = _checked.integer(ctypes.c_size_t, 4 * count if kind == "U" else count, f"dtype {text!r} (item size)")
    if size == 1 or kind in "bSV":
        order = "|"
    elif order in ("", "=", "|"):
        order = _NATIVE
    return f"{order}{kind}{digits.lstrip('0') or '0'}{unit or ''}", size
